# PyTorch per-op overhead (issue 6): small CPU ops with remat off, the hook on and pass-through, the session's
# recorder alone (RematGuard), and the engine session (EngineGuard, the product path), side by side in one run,
# with a per-op summary (see torch_overhead_bench.cc).
#   build/bench/torch_overhead_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
# Built only with the PyTorch integration (LibTorch found), so the core build configures without torch.
if(TARGET remat_torch_engine)
  remat_executable(torch_overhead_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/torch_overhead_bench.cc
                   DEPS remat_torch_engine remat_torch_session remat_torch_hook benchmark::benchmark)
endif()
