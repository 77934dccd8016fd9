add_library(smla_warnings INTERFACE)
target_compile_options(smla_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wvla -Wnon-virtual-dtor
    $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>>  # GCC 12 reports false positives inside std::variant
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${SMLA_WARNINGS_AS_ERRORS}>>:-Werror>)

add_library(smla_sanitize INTERFACE)
if(SMLA_SANITIZE)
  target_compile_options(smla_sanitize INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer>)
  target_link_options(smla_sanitize INTERFACE -fsanitize=address,undefined)
endif()
