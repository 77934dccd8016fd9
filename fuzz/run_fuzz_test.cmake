# One bounded libFuzzer run for CTest: FUZZER over a fresh scratch corpus plus
# the read-only SEEDS, at most SECONDS seconds and RUNS executions. Fails on
# any crash, sanitizer report, leak, timeout or out-of-memory input.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
set(args -max_total_time=${SECONDS} -runs=${RUNS} -timeout=20 -rss_limit_mb=2048 -print_final_stats=1
         -artifact_prefix=${WORK}/artifacts/)
if(DICT)
  list(APPEND args ${DICT})
endif()
execute_process(COMMAND ${FUZZER} ${args} ${WORK}/corpus ${SEEDS} RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${result}); the input is in ${WORK}/artifacts")
endif()
