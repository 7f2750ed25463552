// fusejit: y = BatchNorm1d(scale * (x W^T + b)) with kernels generated for the problem and GPU
// at hand. Describe the problem, make a Plan (compiles or loads kernels), run it on a stream.
//
//   fusejit::Problem p;  p.M = 1024; p.N = 8192; p.K = 8192; p.dtype = fusejit::DType::bf16;
//   fusejit::Plan plan(p);
//   plan.run(stream, {.x = x, .w = w, .y = y, .bias = b, .scale = s, .gamma = g, .beta = beta,
//                     .running_mean = rm, .running_var = rv});
#pragma once

#include "fusejit/device/device.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/dtype.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/plan.hpp"
#include "fusejit/plan/tensors.hpp"
#include "fusejit/problem.hpp"
