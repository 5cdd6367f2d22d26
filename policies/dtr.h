// The DTR family of heuristics (Kirisame et al., ICLR 2021), scored exactly as the prototype's simulator does.
//
//   dtr        (c(s) + c(e*(s))) / (m(s) * staleness(s))   e* = evicted regions forward and backward (needs regions)
//   dtr-eq     (c(s) + sum of distinct neighbouring union-find classes) / (m * staleness)  (needs eq_classes)
//   dtr-local  c(s) / (m * staleness)
//   msps       (c(s) + c(evicted ancestors)) / m            (needs regions; no staleness)
// A non-positive denominator scores infinity.
#pragma once

#include <memory>

#include "policies/policy.h"

namespace remat {

std::unique_ptr<Policy> MakeDtrPolicy();
std::unique_ptr<Policy> MakeDtrEqPolicy();
std::unique_ptr<Policy> MakeDtrLocalPolicy();
std::unique_ptr<Policy> MakeMspsPolicy();

}  // namespace remat
