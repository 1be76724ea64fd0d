// Geometry and validation of a convolution call. The checks are not written here: they are the
// programs fuel_torch/geometry.py compiles from contracts/convolution.geometry.yaml and installs at
// import (install_geometry); validate() runs them on every call, before anything is allocated. The
// Python fake kernels run the same programs, so both give the same messages in the same order.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../contract_rules.h"
#include "problem.h"

namespace fuel {

struct Checker {
  const std::string op;
  const KernelRule& rule;

  [[noreturn]] void fail(const std::string& arg, const std::string& clause, const std::string& seen,
                         const std::string& fix) const {
    fuel::fail(op, rule.kernel, arg, clause, seen, fix);
  }
};

// A postfix program over the call's slots (fuel_torch/geometry.py: SLOTS, in this order).
enum class Opcode : uint8_t { Const, Var, Add, Sub, Mul, Div, Mod, Neg, Max, Min, Lt, Le, Gt, Ge, Eq, Ne, And, Or, Not };
struct Instr {
  Opcode op;
  int64_t operand = 0;  // Const: the value; Var: the slot
};
using Program = std::vector<Instr>;
// The slots: x.dim[0..3], weight.dim[0..3], bias.dim[0]; stride, padding, dilation, output_padding,
// two each; groups; the four lists' lengths; dtype_bytes, physical_memory: the call's inputs. Then
// out.dim[0..3], which the output steps fill as they run (only the table's `returns` read them).
constexpr int kInputSlots = 24, kGeometrySlots = 28;
constexpr int kStrideSlot = 9, kPaddingSlot = 11, kDilationSlot = 13, kOutputPaddingSlot = 15;
constexpr int kDtypeBytesSlot = 22, kPhysicalMemorySlot = 23, kOutSlot = 24;

// A message part: text, a tensor's shape (x, weight, bias), a list argument (stride, padding,
// dilation, output_padding), x's dtype or a program's value.
struct Segment {
  enum Kind : uint8_t { Text, Shape, List, Value, Dtype } kind = Text;
  std::string text;
  int64_t index = 0;
  Program program;
};
using Template = std::vector<Segment>;

// One check at one axis: a rule fails where its program is false, a term where its value leaves
// int64; an output term also gives output dimension `out`. Any step fails where its evaluation
// would leave 128 bits or divide by zero. needs_allocation: only when the op allocates its output
// (the table's allocation rule; a .out call's `out` is checked instead).
struct GeometryStep {
  enum Kind : uint8_t { Rule, Fits, Out } kind = Rule;
  std::string arg, clause;
  Program program;
  Template seen, fix;
  bool needs_bias = false;
  bool needs_allocation = false;
  int out = -1;
};

// Per op (conv2d, conv_transpose2d), the steps in order. Checked when installed: every program is
// well formed (slots in range, stack within bounds), every op gives all four output dimensions
// before any step reads them.
void install_geometry(std::map<std::string, std::vector<GeometryStep>> steps);
Opcode opcode_named(const std::string& name);

// The output shape and the geometry the kernels need; output_padding is set for conv_transpose2d.
// allocates: the op allocates its output, so the table's allocation rule applies (before anything
// is allocated); false for the .out overloads.
Problem validate(const Checker& c, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias,
                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                 std::optional<at::IntArrayRef> output_padding, int64_t groups, bool allocates);

}  // namespace fuel
