// Small hand-made traces for the offline planner's tests (tools/plan_problem.h and what uses it), with the numbers
// worked out by hand next to each.
#pragma once

#include <string>
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

// A training-shaped trace: a forward chain f0..f{n-1} (each read again by its backward op), a backward chain, and
// the last gradient as the output; sizes and times vary so that the choice matters. With `reads_input`, b_i also
// reads f_{i-1} (its forward op's input, as a convolution's backward does).
inline std::string TrainingTrace(int n, bool reads_input = false) {
  std::string t = "{\"ANNOTATION\":\"START\",\"INSTRUCTION\":\"ANNOTATE\"}\n";
  auto call = [&](const std::string& op, const std::string& args, const std::string& result, int bytes, int ns) {
    t += "{\"ARGS\":[" + args + "],\"INSTRUCTION\":\"CALL\",\"NAME\":\"" + op + "\",\"RESULT\":[\"" + result +
         "\"],\"TIME\":\"" + std::to_string(ns) + "\"}\n";
    t += "{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"" + std::to_string(bytes) + "\",\"NAME\":\"" + result + "\"}\n";
    t += "{\"ALIAS\":\"-1\",\"INSTRUCTION\":\"ALIAS\",\"NAME\":\"" + result + "\"}\n";
  };
  auto release = [&](const std::string& name) {
    t += "{\"INSTRUCTION\":\"RELEASE\",\"NAME\":\"" + name + "\"}\n";
  };
  t += "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"x\"}\n{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"50\",\"NAME\":\"x\"}\n";
  std::string prev = "\"x\"";
  for (int i = 0; i < n; ++i) {
    call("f", prev, "f" + std::to_string(i), 100 + 37 * (i % 3), 1 + 7 * (i % 4));
    prev = "\"f" + std::to_string(i) + "\"";
  }
  std::string grad = prev;
  for (int i = n - 1; i >= 0; --i) {
    const std::string g = "g" + std::to_string(i);
    const std::string input = reads_input && i > 0 ? ",\"f" + std::to_string(i - 1) + "\"" : "";
    call("b", grad + ",\"f" + std::to_string(i) + "\"" + input, g, 100 + 37 * (i % 3), 2 + 5 * (i % 3));
    if (grad != prev) release(grad.substr(1, grad.size() - 2));
    release("f" + std::to_string(i));
    grad = "\"" + g + "\"";
  }
  return t;
}

}  // namespace remat::plan::testing
