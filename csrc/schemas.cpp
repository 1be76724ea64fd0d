// Every fuel op's schema, in one place. Kernels register their implementations in their own
// family file (elementwise.cpp, convolution.cpp) with TORCH_LIBRARY_IMPL.
#include <torch/library.h>

TORCH_LIBRARY(fuel, m) {
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem"}) {
    const std::string name(op);
    m.def((name + "(Tensor lhs, Tensor rhs) -> Tensor").c_str());
    // The out tag lets torch.compile functionalize the overload into the functional one.
    m.def((name + ".out(Tensor lhs, Tensor rhs, *, Tensor(a!) out) -> Tensor(a!)").c_str(), {at::Tag::out});
    // Refusals, not kernels: a Python number given to the raw op matches one of these instead of failing
    // torch's schema match ("Unable to cast 2.0 to Tensor"), so that its kernel (fuel_torch/elementwise.py)
    // can say that the raw op takes tensors only and name fuel_torch.<op>, which accepts numbers.
    m.def((name + ".Tensor_Scalar(Tensor lhs, Scalar rhs) -> Tensor").c_str());
    m.def((name + ".Scalar_Tensor(Scalar lhs, Tensor rhs) -> Tensor").c_str());
  }
  // Argument order and defaults as torch.nn.functional.conv2d / conv_transpose2d.
  m.def("conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, int[2] dilation=1, "
        "int groups=1) -> Tensor");
  m.def("conv2d.out(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] dilation=1, int groups=1, *, Tensor(a!) out) -> Tensor(a!)",
        {at::Tag::out});
  // A refusal, as the Scalar overloads above: aten's conv2d.padding takes a string padding; ours matches the
  // same call so that its kernel (fuel_torch/convolution.py) can name fuel_torch.conv2d, which accepts strings.
  m.def("conv2d.padding(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, str padding=\"valid\", "
        "int[2] dilation=1, int groups=1) -> Tensor");
  m.def("conv_transpose2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] output_padding=0, int groups=1, int[2] dilation=1) -> Tensor");
  m.def("conv_transpose2d.out(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] output_padding=0, int groups=1, int[2] dilation=1, *, Tensor(a!) out) -> Tensor(a!)",
        {at::Tag::out});
}

// What the backward nodes (csrc/autograd.cpp) call besides the fuel ops: not user API, and outside
// the contracts. An op rather than a function so that torch.compile records it in a backward graph.
TORCH_LIBRARY(fuel_backward, m) {
  m.def("conv_bias_grad(Tensor grad) -> Tensor");
}
