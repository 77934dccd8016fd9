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

# The Python package (python/): Debian's python3-dev, pybind11-dev and libdlpack-dev.
# The interpreter is named explicitly: a non-Debian python3 may be first on PATH.
# Elsewhere pass -DPython_EXECUTABLE=... (pybind11 from pip is found through it too).
if(SMLA_PYTHON)
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python 3.8 COMPONENTS Interpreter Development.Module)
  set(PYBIND11_FINDPYTHON ON)
  if(Python_FOUND)
    execute_process(COMMAND ${Python_EXECUTABLE} -m pybind11 --cmakedir
                    OUTPUT_VARIABLE smla_pip_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    find_package(pybind11 2.10 CONFIG QUIET HINTS ${smla_pip_pybind11_dir})
  endif()
  find_path(SMLA_DLPACK_INCLUDE_DIR dlpack/dlpack.h)
  if(NOT Python_FOUND OR NOT pybind11_FOUND OR NOT SMLA_DLPACK_INCLUDE_DIR)
    message(STATUS "smla: Python package off (needs python3-dev, pybind11-dev, libdlpack-dev: "
                   "python ${Python_FOUND}, pybind11 ${pybind11_FOUND}, dlpack ${SMLA_DLPACK_INCLUDE_DIR})")
    set(SMLA_PYTHON OFF)
  else()
    if(NOT DEFINED SMLA_PYTHON_INSTALL_DIR)
      execute_process(COMMAND ${Python_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_path('platlib'))"
                      OUTPUT_VARIABLE smla_platlib OUTPUT_STRIP_TRAILING_WHITESPACE)
      set(SMLA_PYTHON_INSTALL_DIR ${smla_platlib} CACHE PATH "Where `cmake --install --component python` puts smla/")
    endif()
    message(STATUS "smla: Python package for ${Python_EXECUTABLE} (pybind11 ${pybind11_VERSION})")
  endif()
endif()
