#!/usr/bin/env python3
"""Checkmate-style ILP for remat-sim's offline optimum (`remat-sim --planner checkmate`).

Reads a problem JSON written by tools/checkmate_planner.cc (a PlanProblem, tools/plan_problem.h, and a budget),
solves the rematerialization ILP with HiGHS (highspy, installed by scripts/setup.sh), writes a result JSON.

Formulation (Jain et al., "Checkmate", MLSys 2020, adapted to values and in-place writes). Stage t (0 <= t <= T,
T = number of ops; stage T is the end) ends with op t's original execution; before it, any recomputable op i < t
may be recomputed, in index order.
  R[t,i]  binary: op i runs in stage t (R[t,t] = 1).
  S[t,v]  binary: value v is resident when stage t begins.
  U[t,k]  memory after op k in stage t (continuous).
  F[t,v,k] in [0,1]: v's bytes go after op k in stage t (only allowed when k touches v last in the stage and v is
          not kept for stage t+1: F is bounded above by those conditions, and the solver raises it to 1 when it can).
  Reads:     R[t,k] <= R[t,p(v)] + S[t,v] for every value v op k reads; the end stage reads every final output.
  Keep:      S[t+1,v] <= S[t,v] + R[t,p(v)];  the original in-place write m consumes v: S[m+1,v] = 0 (a
             recomputed in-place write makes a new copy, as the engine replays it out of place).
  Memory:    before op k: constants(t) + U[t,k-1] + R[t,k] * fresh bytes(k) <= budget (remat-sim's counter rule).
  Objective: minimize the op time of all executions.
Paging (when the problem has "paging": the joint drop-or-page plan), per useful value v and stage t:
  O[t,v]  binary: v is paged out at the end of stage t (after op t's original); it must be resident there.
  I[t,v]  binary: v is paged in at the start of stage t (before the stage's recomputations).
  H[t,v]  binary: a host copy of v exists when stage t begins (within the host budget, if any).
  Keep:      S[t+1,v] <= S[t,v] + R[t,p(v)] + I[t+1,v];  S[t+1,v] + O[t,v] - I[t+1,v] <= 1.
  Host:      I[t,v] <= H[t,v];  H[t+1,v] <= H[t,v] - I[t,v] + O[t,v] (a page-in uses the copy up);
             H[t+1,v] + R[t,p(v)] - O[t,v] <= 1 (a recomputation drops the host copy, as the checker does).
  Objective: + the link time of every copy (runtime/link_model.h TransferNs, given per value as transfer_ns). The
             engine overlaps copies with compute (a page-out never delays an op; an op waits for its inputs'
             page-ins), so the stall the checker measures is at most this sum: the objective is an upper bound of the
             schedule's cost, and the checker's figure is the one reported.
Where it is conservative (never optimistic) against remat-sim's accounting: a value held from an earlier stage and
also recomputed is counted twice, and a value held into a stage where nothing reads it is counted in that stage.
The C++ side verifies the schedule (tools/schedule_check.h), freeing every value as early as possible, and reports
the verified overhead: the ILP's objective is the op time, which the checker recomputes.

Usage: checkmate_ilp.py PROBLEM.json RESULT.json   (exit 0 after writing RESULT.json; 3: highspy not installed)
"""
import json
import math
import sys
import time

MIB = float(1 << 20)


def solve(problem):
    try:
        import highspy
        import numpy as np
    except ImportError as error:
        print(f"checkmate_ilp.py: {error}; run scripts/setup.sh (it installs highspy) or set REMAT_PYTHON "
              f"to an interpreter that has highspy and numpy (this one is {sys.executable})", file=sys.stderr)
        sys.exit(3)

    ops = problem["ops"]
    values = problem["values"]
    T = len(ops)
    # Byte counts are whole: half a byte over the budget lets the solver meet an exact fit despite its tolerances
    # (1e-9 MiB per row, below), and anything it accepts is within the budget to the byte (checked again in C++).
    budget = (problem["budget"] + 0.5) / MIB
    consts = [b / MIB for b in problem["stage_constant_bytes"]]
    death = problem["constant_death"]
    vbytes = [v["bytes"] / MIB for v in values]
    producer = [v["producer"] for v in values]
    output = [bool(v["output"]) for v in values]
    readers = [[] for _ in values]
    consumer = [-1] * len(values)
    for k, op in enumerate(ops):
        for v in op["inputs"]:
            readers[v].append(k)
        for old, made in op["in_place"]:
            consumer[old] = k
    recomputable = [bool(op["fresh"] or op["in_place"]) for op in ops]
    # The last stage in which op i may run: its constants must be in memory.
    last_stage = []
    for op in ops:
        limit = T
        for c in op["constant_inputs"]:
            limit = min(limit, death[c] - 1)
        last_stage.append(limit)
    fresh_bytes = [sum(vbytes[v] for v in op["fresh"]) for op in ops]
    # A recomputed in-place write makes a new copy (the engine replays it out of place): its value adds bytes.
    replay_bytes = [fresh_bytes[k] + sum(vbytes[made] for _, made in op["in_place"]) for k, op in enumerate(ops)]
    useful = [bool(readers[v]) or output[v] for v in range(len(values))]
    paging = problem.get("paging")

    # Costs in thousandths of the baseline compute (the objective is 1000 x overhead): ns would span 1e2..1e8 and
    # upset HiGHS's tolerances.
    fixed_ns = float(sum(op["time_ns"] for op in ops))
    scale = 1000.0 / fixed_ns if fixed_ns > 0 else 1.0
    col_cost, col_lo, col_hi, integral = [], [], [], []

    def new_col(cost, lo, hi, is_int):
        col_cost.append(cost)
        col_lo.append(lo)
        col_hi.append(hi)
        integral.append(1 if is_int else 0)
        return len(col_cost) - 1

    R = {}  # (t, i) -> column; R[t,t] is the constant 1 (not a column)
    for t in range(T + 1):
        for i in range(min(t, T)):
            if recomputable[i] and t <= last_stage[i]:
                R[(t, i)] = new_col(ops[i]["time_ns"] * scale, 0.0, 1.0, True)
    S = {}
    for v in range(len(values)):
        if not useful[v]:
            continue
        for t in range(producer[v] + 1, T + 1):
            S[(t, v)] = new_col(0.0, 0.0, 1.0, True)

    # Paging columns: O[t,v] for producer <= t < the last stage that reads v (T for an output), I and H for
    # producer < t <= that stage; none after an original in-place write consumes v.
    O, I, H = {}, {}, {}
    if paging:
        transfer = paging["transfer_ns"]
        for v in range(len(values)):
            if not useful[v]:
                continue
            last = T if output[v] else max(readers[v])
            if consumer[v] >= 0:
                last = min(last, consumer[v])
            for t in range(producer[v], last):
                O[(t, v)] = new_col(transfer[v] * scale, 0.0, 1.0, True)
            for t in range(producer[v] + 1, last + 1):
                I[(t, v)] = new_col(transfer[v] * scale, 0.0, 1.0, True)
                H[(t, v)] = new_col(0.0, 0.0, 1.0, True)

    rows_lo, rows_hi, starts, index, value = [], [], [0], [], []

    def add_row(terms, lo, hi):
        merged = {}
        for col, coef in terms:
            merged[col] = merged.get(col, 0.0) + coef
        for col, coef in merged.items():
            if coef != 0.0:
                index.append(col)
                value.append(coef)
        starts.append(len(index))
        rows_lo.append(lo)
        rows_hi.append(hi)

    INF = highspy.kHighsInf

    def r_term(t, k):
        """(columns, constant) for R[t,k]."""
        if k == t:
            return [], 1.0
        col = R.get((t, k))
        return ([(col, 1.0)], 0.0) if col is not None else ([], 0.0)

    for t in range(T + 1):
        stage_ops = [i for i in range(t) if (t, i) in R]
        if t < T:
            stage_ops.append(t)
        # Reads.
        for k in stage_ops:
            k_terms, k_const = r_term(t, k)
            for v in ops[k]["inputs"]:
                p_terms, p_const = r_term(t, producer[v])
                terms = k_terms + [(c, -a) for c, a in p_terms]
                if (t, v) in S:
                    terms.append((S[(t, v)], -1.0))
                add_row(terms, -INF, p_const - k_const)
        if t == T:
            for v in range(len(values)):
                if output[v]:
                    p_terms, _ = r_term(t, producer[v])
                    add_row(p_terms + [(S[(t, v)], 1.0)], 1.0, INF)
        # Keep, and in-place consumption.
        if t < T:
            for v in range(len(values)):
                if (t + 1, v) not in S:
                    continue
                terms = [(S[(t + 1, v)], 1.0)]
                if (t, v) in S:
                    terms.append((S[(t, v)], -1.0))
                p_terms, p_const = r_term(t, producer[v])
                terms += [(c, -a) for c, a in p_terms]
                if (t + 1, v) in I:
                    terms.append((I[(t + 1, v)], -1.0))
                add_row(terms, -INF, p_const)
                if (t, v) in O:  # paged out at the end of stage t: not kept unless paged in again
                    add_row([(S[(t + 1, v)], 1.0), (O[(t, v)], 1.0)] +
                            ([(I[(t + 1, v)], -1.0)] if (t + 1, v) in I else []), -INF, 1.0)
                if consumer[v] == t:  # the original in-place write consumes v
                    col_hi[S[(t + 1, v)]] = 0.0
        # Paging: a page-out needs v resident in stage t; host copies.
        if paging:
            for v in range(len(values)):
                if (t, v) in O:
                    p_terms, p_const = r_term(t, producer[v])
                    terms = [(O[(t, v)], 1.0)] + [(c, -a) for c, a in p_terms]
                    if (t, v) in S:
                        terms.append((S[(t, v)], -1.0))
                    add_row(terms, -INF, p_const)
                if (t, v) in I:
                    add_row([(I[(t, v)], 1.0), (H[(t, v)], -1.0)], -INF, 0.0)
                if (t + 1, v) in H:
                    terms = [(H[(t + 1, v)], 1.0)]
                    if (t, v) in H:
                        terms += [(H[(t, v)], -1.0), (I[(t, v)], 1.0)]
                    if (t, v) in O:
                        terms.append((O[(t, v)], -1.0))
                    add_row(terms, -INF, 0.0)
                    p_terms, p_const = r_term(t, producer[v])
                    terms = [(H[(t + 1, v)], 1.0)] + p_terms
                    if (t, v) in O:
                        terms.append((O[(t, v)], -1.0))
                    add_row(terms, -INF, 1.0 - p_const)
            if paging.get("host_budget") is not None:
                host_terms = [(H[(t, v)], vbytes[v]) for v in range(len(values)) if (t, v) in H]
                if host_terms:
                    add_row(host_terms, -INF, (paging["host_budget"] + 0.5) / MIB)
        # Memory, op by op.
        position = {k: n for n, k in enumerate(stage_ops)}
        prev_terms = [(S[(t, v)], vbytes[v]) for v in range(len(values)) if (t, v) in S]
        for k in stage_ops:
            k_terms, k_const = r_term(t, k)
            out = fresh_bytes[k] if k == t else replay_bytes[k]
            # Before k: constants + in use + outputs <= budget.
            add_row(prev_terms + [(c, a * out) for c, a in k_terms], -INF, budget - consts[t] - k_const * out)
            # After k: U = before + outputs - freed.
            u = new_col(0.0, -INF, INF, False)
            terms = [(u, 1.0)] + [(c, -a) for c, a in prev_terms] + [(c, -a * out) for c, a in k_terms]
            touched = list(ops[k]["fresh"]) + [made for _, made in ops[k]["in_place"]] + \
                [v for v in ops[k]["inputs"] if not (k == t and consumer[v] == k)]
            for v in touched:
                if t == T and output[v]:
                    continue  # read by the end
                later = [j for j in readers[v] if j > k and j in position]
                if consumer[v] == t and t in later:
                    continue  # consumed by op t's original write: its bytes become the new value's
                if t in later:
                    continue  # read again by op t itself
                f = new_col(0.0, 0.0, 1.0, False)
                terms.append((f, vbytes[v]))
                if k_terms:
                    add_row([(f, 1.0)] + [(c, -a) for c, a in k_terms], -INF, 0.0)
                if (t + 1, v) in S:
                    add_row([(f, 1.0), (S[(t + 1, v)], 1.0)], -INF, 1.0)
                if (t, v) in O:
                    add_row([(f, 1.0), (O[(t, v)], 1.0)], -INF, 1.0)
                for j in later:
                    add_row([(f, 1.0), (R[(t, j)], 1.0)], -INF, 1.0)
            add_row(terms, 0.0, 0.0)
            prev_terms = [(u, 1.0)]

    lp = highspy.HighsLp()
    lp.num_col_ = len(col_cost)
    lp.num_row_ = len(rows_lo)
    lp.col_cost_ = np.array(col_cost, dtype=np.double)
    lp.col_lower_ = np.array(col_lo, dtype=np.double)
    lp.col_upper_ = np.array(col_hi, dtype=np.double)
    lp.row_lower_ = np.array(rows_lo, dtype=np.double)
    lp.row_upper_ = np.array(rows_hi, dtype=np.double)
    lp.offset_ = fixed_ns * scale
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.double)
    lp.a_matrix_.num_col_ = lp.num_col_
    lp.a_matrix_.num_row_ = lp.num_row_
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in integral]

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(problem.get("verbose", False)))
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(problem["time_limit_s"]))
    h.setOptionValue("mip_rel_gap", float(problem.get("mip_rel_gap", 1e-4)))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.passModel(lp)
    start_accepted = False
    if problem.get("start"):
        # A valid schedule (a policy's) in the ILP's form: each stage's recomputations in index order, once each;
        # S is the least that form needs (what a stage reads before making it, or keeps for a later stage).
        x0 = np.zeros(lp.num_col_)
        stage, chosen = 0, set()
        for k in problem["start"]:
            if k == stage:
                stage += 1
            elif (stage, k) in R:
                chosen.add((stage, k))
        for key in chosen:
            x0[R[key]] = 1.0
        made_in = {}  # (t, v) -> True when stage t makes v before any read in that stage
        need = {}
        for t in range(T + 1):
            stage_ops = sorted([i for (tt, i) in chosen if tt == t]) + ([t] if t < T else [])
            made = set()
            for k in stage_ops:
                for v in ops[k]["inputs"]:
                    if v not in made:
                        need[(t, v)] = True
                for v in ops[k]["fresh"]:
                    made.add(v)
                for _, v in ops[k]["in_place"]:
                    made.add(v)
            if t == T:
                for v in range(len(values)):
                    if output[v] and v not in made:
                        need[(t, v)] = True
            for v in made:
                made_in[(t, v)] = True
        for v in range(len(values)):
            if not useful[v]:
                continue
            later = False  # S[t+1, v]
            for t in range(T, producer[v], -1):
                held = (t, v) in need or (later and (t, v) not in made_in)
                if held and (t, v) in S:
                    x0[S[(t, v)]] = 1.0
                later = held
        integer_index = [c for c in range(lp.num_col_) if integral[c]]
        h.setSolution(len(integer_index), np.array(integer_index, dtype=np.int32), x0[integer_index])
        start_accepted = True
    start = time.monotonic()
    h.run()
    solve_s = time.monotonic() - start
    status = h.getModelStatus()
    info = h.getInfo()
    result = {
        "solver": f"HiGHS {h.version()}",
        "columns": lp.num_col_,
        "rows": lp.num_row_,
        "binaries": int(sum(integral)),
        "nonzeros": len(index),
        "solve_s": solve_s,
        "model_status": h.modelStatusToString(status),
        "baseline_ns": fixed_ns,
        "start_accepted": start_accepted,
    }
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if status == highspy.HighsModelStatus.kOptimal:
        result["status"] = "optimal"
    elif status == highspy.HighsModelStatus.kInfeasible:
        result["status"] = "infeasible"
    elif status == highspy.HighsModelStatus.kTimeLimit:
        result["status"] = "time-limit"
    else:
        result["status"] = "error"
    bound = info.mip_dual_bound
    result["bound_ns"] = bound / scale if math.isfinite(bound) else None
    if has_solution and result["status"] in ("optimal", "time-limit"):
        x = h.getSolution().col_value
        result["objective_ns"] = info.objective_function_value / scale
        result["mip_gap"] = info.mip_gap
        schedule, steps = [], []  # steps: [kind, index], kind 0 run, 1 page out, 2 page in
        for t in range(T + 1):
            for v in range(len(values)):
                col = I.get((t, v))
                if col is not None and x[col] > 0.5:
                    steps.append([2, v])
            for i in range(t):
                col = R.get((t, i))
                if col is not None and x[col] > 0.5:
                    schedule.append(i)
                    steps.append([0, i])
            if t < T:
                schedule.append(t)
                steps.append([0, t])
            for v in range(len(values)):
                col = O.get((t, v))
                if col is not None and x[col] > 0.5:
                    steps.append([1, v])
        result["schedule"] = schedule
        if paging:
            result["steps"] = steps
    return result


def main(argv):
    if len(argv) != 3:
        print("usage: checkmate_ilp.py PROBLEM.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        problem = json.load(f)
    result = solve(problem)
    for key, value in list(result.items()):
        if isinstance(value, float) and not math.isfinite(value):
            result[key] = None  # JSON has no infinity (HiGHS reports an infinite gap or bound before a solution)
    with open(argv[2], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
