// Small hand-made traces for the offline planner's tests (tools/plan_problem.h and what uses it), with the numbers
// worked out by hand next to each.
#pragma once

#include <utility>

#include "gtest/gtest.h"
#include "runtime/trace.h"
#include "tools/plan_problem.h"

namespace remat::plan::testing {

// The planning problem of a trace text (a test failure if it does not parse or build).
inline PlanProblem BuildProblem(const char* text) {
  absl::StatusOr<Trace> trace = ParseTrace(text, "t.log");
  EXPECT_TRUE(trace.ok()) << trace.status();
  absl::StatusOr<PlanProblem> problem = BuildPlanProblem(*trace);
  EXPECT_TRUE(problem.ok()) << problem.status();
  return *std::move(problem);
}

// A chain whose first value is read again at the end:
//   a = op0()       100 B, 5 ns
//   b = op1(a)      200 B, 1 ns
//   c = op2(b)      100 B, 1 ns
//   d = op3(c, a)   100 B, 1 ns   (d is the output; a, b, c are released after it)
// Unconstrained (remat-sim's baseline): peak 500 = a + b + c + d at op3 (nothing released before), compute 8 ns.
// At a budget of 300: op2 needs b + c = 300 with a gone, so a is dropped and recomputed for op3 (c + a + d = 300):
// the optimum is 8 + 5 = 13 ns, overhead 1.625. At 250, op1 alone needs a + b = 300: infeasible.
inline const char* kChain = R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"ARGS":[],"INSTRUCTION":"CALL","NAME":"op0","RESULT":["a"],"TIME":"5"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"ARGS":["a"],"INSTRUCTION":"CALL","NAME":"op1","RESULT":["b"],"TIME":"1"}
{"INSTRUCTION":"MEMORY","MEMORY":"200","NAME":"b"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"b"}
{"ARGS":["b"],"INSTRUCTION":"CALL","NAME":"op2","RESULT":["c"],"TIME":"1"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"c"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"c"}
{"ARGS":["c","a"],"INSTRUCTION":"CALL","NAME":"op3","RESULT":["d"],"TIME":"1"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"d"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"d"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
{"INSTRUCTION":"RELEASE","NAME":"b"}
{"INSTRUCTION":"RELEASE","NAME":"c"}
)";

// Constants, a view, an in-place write and a released constant:
//   w (constant, 64 B), v (constant, 32 B, released after op0)
//   x = op0(w, v)          100 B, 10 ns
//   xv = view(x)           a view of x (alias 0), 1 ns: no value
//   add_(xv, w) MUTATE 0   writes x's storage in place, 3 ns: consumes x's value, makes x' (100 B)
//   y = op2(x)             50 B, 2 ns; x and xv released; y is the output
inline const char* kWrites = R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"64","NAME":"w"}
{"INSTRUCTION":"CONSTANT","NAME":"v"}
{"INSTRUCTION":"MEMORY","MEMORY":"32","NAME":"v"}
{"ARGS":["w","v"],"INSTRUCTION":"CALL","NAME":"op0","RESULT":["x"],"TIME":"10"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"x"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x"}
{"INSTRUCTION":"RELEASE","NAME":"v"}
{"ARGS":["x"],"INSTRUCTION":"CALL","NAME":"view","RESULT":["xv"],"TIME":"1"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"xv"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"xv"}
{"ARGS":["xv","w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"3"}
{"ARGS":["x"],"INSTRUCTION":"CALL","NAME":"op2","RESULT":["y"],"TIME":"2"}
{"INSTRUCTION":"MEMORY","MEMORY":"50","NAME":"y"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"y"}
{"INSTRUCTION":"RELEASE","NAME":"x"}
{"INSTRUCTION":"RELEASE","NAME":"xv"}
)";

}  // namespace remat::plan::testing
