# Trace parsing (issue 22, item 7): the hand-written JSON line tokenizer against simdjson (ondemand) and
# nlohmann-json on the five shared DTR traces, and the runtime's whole ParseTrace (see trace_parse_bench.cc).
#   build/bench/trace_parse_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
find_package(simdjson REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
remat_executable(trace_parse_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/trace_parse_bench.cc
                 DEPS remat_runtime simdjson::simdjson nlohmann_json::nlohmann_json benchmark::benchmark)
target_compile_definitions(trace_parse_bench PRIVATE REMAT_SHARED_DIR_DEFAULT="${REMAT_SHARED_DIR}")
