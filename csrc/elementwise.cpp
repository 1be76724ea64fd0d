// The elementwise binary family's entry points: fuel::<op> and fuel::<op>.out for add, sub, mul,
// div, maximum, minimum, pow and rem. This file checks and registers; the arithmetic is in
// kernels/elementwise_kernels.cpp, compiled once per instruction-set level (dispatch.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "contract_rules.h"
#include "dispatch.h"
#include "kernels/elementwise_kernels.h"

namespace fuel {

FUEL_DECLARE_KERNELS(BinaryKernels, binary_kernels)

namespace {

struct Add { static constexpr const char* name = "add"; static constexpr BinaryOp op = BinaryOp::add; };
struct Sub { static constexpr const char* name = "sub"; static constexpr BinaryOp op = BinaryOp::sub; };
struct Mul { static constexpr const char* name = "mul"; static constexpr BinaryOp op = BinaryOp::mul; };
struct Div { static constexpr const char* name = "div"; static constexpr BinaryOp op = BinaryOp::div; };
struct Maximum { static constexpr const char* name = "maximum"; static constexpr BinaryOp op = BinaryOp::maximum; };
struct Minimum { static constexpr const char* name = "minimum"; static constexpr BinaryOp op = BinaryOp::minimum; };
struct Pow { static constexpr const char* name = "pow"; static constexpr BinaryOp op = BinaryOp::pow; };
struct Rem { static constexpr const char* name = "rem"; static constexpr BinaryOp op = BinaryOp::rem; };

// The kernel's own check of the buffers it is about to touch, independent of the contract rules
// (check_inputs/check_out): a contract file that lost a clause must give an error, never an
// out-of-bounds access. Allocates nothing unless it fails.
void check_buffers(const char* op, const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& out) {
  const at::Tensor* buffers[] = {&lhs, &rhs, &out};
  const char* names[] = {"lhs", "rhs", "out"};
  for (int i = 0; i < 3; ++i) {
    const at::Tensor& t = *buffers[i];
    // An empty tensor is never touched, so its strides and offset cannot matter.
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == lhs.scalar_type() && t.numel() == lhs.numel() &&
                    (t.numel() == 0 || (t.is_contiguous() && t.storage_offset() == 0)),
                "fuel::", op, ": the kernel refuses argument '", names[i], "' (", t.scalar_type(), ", shape ",
                t.sizes(), ", strides ", t.strides(), ", storage offset ", t.storage_offset(), ", device ",
                t.device(), ") next to lhs (", lhs.scalar_type(), ", shape ", lhs.sizes(),
                "): it reads and writes lhs, rhs and out as contiguous CPU buffers of one dtype and ",
                "one number of elements. The installed contract rules let this call through: check the ",
                "contract's shape_constraint (same_as), dtype and layout clauses.");
  }
}

template <typename Op>
at::Tensor& binary_out(const at::Tensor& lhs, const at::Tensor& rhs, at::Tensor& out) {
  const KernelRule& rule = check_inputs(Op::name, {&lhs, &rhs});
  check_out(rule, out, lhs.scalar_type(), lhs.sizes(), {&lhs, &rhs});
  check_buffers(Op::name, lhs, rhs, out);
  const BinaryKernel kernel =
      FUEL_KERNELS_FOR_CPU(binary_kernels).kernel[static_cast<int>(Op::op)][kernel_dtype_slot(lhs.scalar_type())];
  kernel(lhs.const_data_ptr(), rhs.const_data_ptr(), out.mutable_data_ptr(), lhs.numel());
  return out;
}

template <typename Op>
at::Tensor binary(const at::Tensor& lhs, const at::Tensor& rhs) {
  // Validate before allocating, so a bad call never allocates an output.
  check_inputs(Op::name, {&lhs, &rhs});
  at::Tensor out = at::empty(lhs.sizes(), lhs.options().memory_format(at::MemoryFormat::Contiguous));
  return binary_out<Op>(lhs, rhs, out);
}

template <typename Op>
void register_op(torch::Library& m) {
  const std::string name(Op::name);
  m.impl(name.c_str(), TORCH_FN(binary<Op>));
  m.impl((name + ".out").c_str(), TORCH_FN(binary_out<Op>));
}

}  // namespace

// The Judge's streaming roof probe (kernels/elementwise_kernels.h): out = lhs + rhs, float32,
// non-temporal stores at every size. Not an op: it is reached as fuel_torch._C.streaming_triad.
void streaming_triad(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& out) {
  TORCH_CHECK(lhs.scalar_type() == at::kFloat, "fuel_torch._C.streaming_triad: float32 tensors only, saw ",
              lhs.scalar_type());
  check_buffers("streaming_triad", lhs, rhs, out);
  FUEL_KERNELS_FOR_CPU(binary_kernels).streaming_triad(lhs.const_data_ptr(), rhs.const_data_ptr(),
                                                       out.mutable_data_ptr(), lhs.numel());
}

TORCH_LIBRARY_IMPL(fuel, CPU, m) {
  register_op<Add>(m);
  register_op<Sub>(m);
  register_op<Mul>(m);
  register_op<Div>(m);
  register_op<Maximum>(m);
  register_op<Minimum>(m);
  register_op<Pow>(m);
  register_op<Rem>(m);
}

}  // namespace fuel
