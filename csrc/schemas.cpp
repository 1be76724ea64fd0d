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
}
