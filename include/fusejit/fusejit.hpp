// fusejit: y = BatchNorm1d(scale * (x W^T + b)) with kernels generated for the problem and GPU
// at hand. Describe the problem, make a Plan (compiles or loads kernels), run it on a stream.
//
//   fusejit::Problem p;  p.M = 1024; p.N = 8192; p.K = 8192; p.dtype = fusejit::DType::bf16;
//   fusejit::Plan plan(p);
//   plan.run(stream, {.x = x, .w = w, .y = y, .bias = b, .scale = s, .gamma = g, .beta = beta,
//                     .running_mean = rm, .running_var = rv});
#pragma once

#include "fusejit/backward.hpp"
#include "fusejit/device.hpp"
#include "fusejit/driver.hpp"
#include "fusejit/dtype.hpp"
#include "fusejit/error.hpp"
#include "fusejit/kernel_config.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tensors.hpp"
#include "fusejit/version.hpp"
