// Every fuel op's schema, in one place. Kernels register their implementations in their own
// family file (elementwise.cpp, convolution.cpp) with TORCH_LIBRARY_IMPL.
#include <torch/library.h>

TORCH_LIBRARY(fuel, m) {
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem"}) {
    const std::string name(op);
    m.def((name + "(Tensor lhs, Tensor rhs) -> Tensor").c_str());
    // The out tag lets torch.compile functionalize the overload into the functional one.
    m.def((name + ".out(Tensor lhs, Tensor rhs, *, Tensor(a!) out) -> Tensor(a!)").c_str(), {at::Tag::out});
  }
  // Argument order and defaults as torch.nn.functional.conv2d / conv_transpose2d.
  m.def("conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, int[2] dilation=1, "
        "int groups=1) -> Tensor");
  m.def("conv2d.out(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] dilation=1, int groups=1, *, Tensor(a!) out) -> Tensor(a!)",
        {at::Tag::out});
  m.def("conv_transpose2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] output_padding=0, int groups=1, int[2] dilation=1) -> Tensor");
  m.def("conv_transpose2d.out(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] output_padding=0, int groups=1, int[2] dilation=1, *, Tensor(a!) out) -> Tensor(a!)",
        {at::Tag::out});
}
