# Every dependency is a Debian package found on the system; nothing is fetched.
find_package(fmt REQUIRED)                 # libfmt-dev
find_package(nlohmann_json 3 REQUIRED)     # nlohmann-json3-dev
find_package(hwy REQUIRED)                 # libhwy-dev (Highway SIMD, CPU backend)
find_package(Threads REQUIRED)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)                # libopenblas-dev (output projection GEMMs, BLAS baseline)
if(SMLA_BUILD_TOOLS)
  find_package(CLI11 REQUIRED)             # libcli11-dev
endif()
if(SMLA_BUILD_TESTS)
  find_package(GTest REQUIRED)             # libgtest-dev, libgmock-dev
endif()
if(SMLA_BUILD_BENCH)
  find_package(benchmark REQUIRED)         # libbenchmark-dev
endif()
