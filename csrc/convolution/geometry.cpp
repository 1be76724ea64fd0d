#include "geometry.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

namespace fuel {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int kMaxDepth = 16;  // fuel_torch/geometry.py's MAX_DEPTH: the compiler refuses deeper programs

using Int128 = __int128;

namespace {

using Steps = std::map<std::string, std::vector<GeometryStep>, std::less<>>;

std::mutex install_mutex;
// As the contract rules: tables are never freed, a call in flight may still read an older one.
std::vector<std::unique_ptr<Steps>> all_tables;
std::atomic<const Steps*> current_table{nullptr};

// The values of one call in the slots' order (fuel_torch/geometry.py: _slots); entries past a
// list's end and an absent bias read 0 (a list's int[2] check refuses it before anything else runs),
// as do the output dimensions until the output steps give them.
struct Call {
  const at::Tensor* tensors[3];
  at::IntArrayRef lists[4];
  int64_t slots[kGeometrySlots];
};

// sysconf's physical pages times the page size, read once: the machine's memory does not change.
int64_t physical_memory() {
  static const int64_t bytes =
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}

Call call_of(const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias, at::IntArrayRef stride,
             at::IntArrayRef padding, at::IntArrayRef dilation, std::optional<at::IntArrayRef> output_padding,
             int64_t groups) {
  Call call{{&x, &weight, bias}, {stride, padding, dilation, output_padding.value_or(at::IntArrayRef())}, {}};
  int64_t* slot = call.slots;
  for (int k = 0; k < 4; ++k) *slot++ = x.size(k);
  for (int k = 0; k < 4; ++k) *slot++ = weight.size(k);
  *slot++ = bias ? bias->size(0) : 0;
  for (const at::IntArrayRef list : call.lists) {
    for (size_t k = 0; k < 2; ++k) *slot++ = k < list.size() ? list[k] : 0;
  }
  *slot++ = groups;
  for (const at::IntArrayRef list : call.lists) *slot++ = static_cast<int64_t>(list.size());
  *slot++ = static_cast<int64_t>(c10::elementSize(x.scalar_type()));
  *slot++ = physical_memory();
  for (int k = 0; k < 4; ++k) *slot++ = 0;
  return call;
}

// The smallest value of each evaluation type (std::numeric_limits knows no __int128 under -std=c++20).
constexpr int64_t lowest(int64_t) { return kInt64Min; }
constexpr Int128 lowest(Int128) { return static_cast<Int128>(static_cast<unsigned __int128>(1) << 127); }

// a op b in T, false where the result would not fit (never wraps: no undefined behaviour).
template <typename T>
bool apply(Opcode op, T a, T b, T& r) {
  switch (op) {
    case Opcode::Add: return !__builtin_add_overflow(a, b, &r);
    case Opcode::Sub: return !__builtin_sub_overflow(a, b, &r);
    case Opcode::Mul: return !__builtin_mul_overflow(a, b, &r);
    case Opcode::Div:  // floor division, as Python's //
      if (b == 0 || (a == lowest(T{}) && b == -1)) return false;
      r = a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
      return true;
    case Opcode::Mod:  // the sign of the divisor, as Python's %
      if (b == 0) return false;
      r = b == -1 ? 0 : a % b;
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      return true;
    case Opcode::Max: r = std::max(a, b); return true;
    case Opcode::Min: r = std::min(a, b); return true;
    case Opcode::Lt: r = a < b; return true;
    case Opcode::Le: r = a <= b; return true;
    case Opcode::Gt: r = a > b; return true;
    case Opcode::Ge: r = a >= b; return true;
    case Opcode::Eq: r = a == b; return true;
    case Opcode::Ne: r = a != b; return true;
    case Opcode::And: r = a && b; return true;
    case Opcode::Or: r = a || b; return true;
    default: return false;  // the unary and leaf opcodes never reach here
  }
}

// The program's value in T, or false where a step does not fit in T or divides by zero. The
// program was checked at install (depth, slots), so the stack stays in bounds.
template <typename T>
bool evaluate_as(const Program& program, const int64_t* slots, T& value) {
  T stack[kMaxDepth];
  int top = 0;
  for (const Instr& in : program) {
    switch (in.op) {
      case Opcode::Const: stack[top++] = in.operand; break;
      case Opcode::Var: stack[top++] = slots[in.operand]; break;
      case Opcode::Neg:
        if (__builtin_sub_overflow(static_cast<T>(0), stack[top - 1], &stack[top - 1])) return false;
        break;
      case Opcode::Not: stack[top - 1] = !stack[top - 1]; break;
      default:
        --top;
        if (!apply<T>(in.op, stack[top - 1], stack[top], stack[top - 1])) return false;
    }
  }
  value = stack[0];
  return true;
}

// The value in 128 bits. Every call's values start in int64, and where no step leaves int64 the
// two agree, so int64 runs first (the cheap common case) and 128 bits only where it overflowed.
bool evaluate(const Program& program, const int64_t* slots, Int128& value) {
  int64_t narrow = 0;
  if (evaluate_as<int64_t>(program, slots, narrow)) {
    value = narrow;
    return true;
  }
  return evaluate_as<Int128>(program, slots, value);
}

std::string int128_str(Int128 v) {
  if (v >= kInt64Min && v <= kInt64Max) return std::to_string(static_cast<int64_t>(v));
  std::string digits;
  const bool negative = v < 0;
  do {
    const int digit = static_cast<int>(v % 10);
    digits.insert(digits.begin(), static_cast<char>('0' + (negative ? -digit : digit)));
    v /= 10;
  } while (v != 0);
  return (negative ? "-" : "") + digits;
}

// A message part, built only when a check fails.
std::string render(const Template& parts, const Call& call) {
  std::string text;
  for (const Segment& part : parts) {
    Int128 value = 0;
    switch (part.kind) {
      case Segment::Text: text += part.text; break;
      case Segment::Shape: text += shape_str(call.tensors[part.index]->sizes()); break;
      case Segment::List: text += shape_str(call.lists[part.index]); break;
      case Segment::Dtype: text += dtype_str(call.tensors[0]->scalar_type()); break;
      case Segment::Value: text += evaluate(part.program, call.slots, value) ? int128_str(value) : "?"; break;
    }
  }
  return text;
}

// The stack depth a program reaches, or -1 where it is malformed (a slot out of range, an operand
// missing, not exactly one value left).
int depth_of(const Program& program) {
  int top = 0, deepest = 0;
  for (const Instr& in : program) {
    if (in.op == Opcode::Var && (in.operand < 0 || in.operand >= kGeometrySlots)) return -1;
    const bool leaf = in.op == Opcode::Const || in.op == Opcode::Var;
    const bool unary = in.op == Opcode::Neg || in.op == Opcode::Not;
    if (top < (leaf ? 0 : unary ? 1 : 2)) return -1;
    top += leaf ? 1 : unary ? 0 : -1;
    deepest = std::max(deepest, top);
  }
  return top == 1 ? deepest : -1;
}

// `given`: whether the steps before this one gave all four output dimensions (a program that reads
// them earlier would read zeros).
void check_program(const Program& program, const std::string& op, bool given) {
  const int depth = depth_of(program);
  TORCH_CHECK(depth >= 1 && depth <= kMaxDepth, "fuel_torch: a geometry program of fuel::", op,
              " is malformed or deeper than ", kMaxDepth);
  for (const Instr& in : program) {
    TORCH_CHECK(given || in.op != Opcode::Var || in.operand < kOutSlot, "fuel_torch: a geometry program of fuel::",
                op, " reads an output dimension before the steps that give it");
  }
}

}  // namespace

Opcode opcode_named(const std::string& name) {
  static const std::map<std::string, Opcode> opcodes = {
      {"const", Opcode::Const}, {"var", Opcode::Var}, {"add", Opcode::Add}, {"sub", Opcode::Sub},
      {"mul", Opcode::Mul},     {"div", Opcode::Div}, {"mod", Opcode::Mod}, {"neg", Opcode::Neg},
      {"max", Opcode::Max},     {"min", Opcode::Min}, {"lt", Opcode::Lt},   {"le", Opcode::Le},
      {"gt", Opcode::Gt},       {"ge", Opcode::Ge},   {"eq", Opcode::Eq},   {"ne", Opcode::Ne},
      {"and", Opcode::And},     {"or", Opcode::Or},   {"not", Opcode::Not}};
  const auto it = opcodes.find(name);
  TORCH_CHECK(it != opcodes.end(), "fuel_torch: unknown geometry opcode ", name);
  return it->second;
}

void install_geometry(std::map<std::string, std::vector<GeometryStep>> steps) {
  for (const auto& [op, list] : steps) {
    bool gives[4] = {false, false, false, false};
    for (const GeometryStep& step : list) {
      const bool given = gives[0] && gives[1] && gives[2] && gives[3];
      check_program(step.program, op, given);
      for (const Template* parts : {&step.seen, &step.fix}) {
        for (const Segment& part : *parts) {
          if (part.kind == Segment::Value) check_program(part.program, op, given);
          TORCH_CHECK(part.kind == Segment::Text || part.kind == Segment::Value || part.kind == Segment::Dtype ||
                          (part.index >= 0 && part.index < (part.kind == Segment::Shape ? 3 : 4)),
                      "fuel_torch: a geometry message of fuel::", op, " names no argument");
        }
      }
      TORCH_CHECK(step.out < 4, "fuel_torch: fuel::", op, " has no output dimension ", step.out);
      if (step.out >= 0) gives[step.out] = true;
      TORCH_CHECK((!step.needs_bias && !step.needs_allocation) || step.out < 0,
                  "fuel_torch: an output dimension cannot need a bias or an allocation");
    }
    TORCH_CHECK(gives[0] && gives[1] && gives[2] && gives[3], "fuel_torch: the geometry of fuel::", op,
                " does not give all four output dimensions");
  }
  std::lock_guard<std::mutex> lock(install_mutex);
  all_tables.push_back(std::make_unique<Steps>(steps.begin(), steps.end()));
  current_table.store(all_tables.back().get(), std::memory_order_release);
}

namespace {

// The last call that passed on this thread: the checks read nothing but the slots, so a call with the
// same op, table, bias presence, allocation and input slots (dtype_bytes among them: the allocation
// rule depends on the element size) passes them again with the same outputs (a training loop
// repeats one geometry: its calls skip the programs).
struct Passed {
  const std::vector<GeometryStep>* steps = nullptr;
  bool bias = false, allocates = false;
  int64_t slots[kInputSlots] = {};
  int64_t out[4] = {};
};
thread_local Passed last_passed;

// Runs the steps in order (messages built only on failure); the output dimensions into `out` and
// into their slots, where the steps after them read them.
void run_steps(const Checker& c, const std::vector<GeometryStep>& steps, Call& call, bool allocates, int64_t* out) {
  const bool bias = call.tensors[2] != nullptr;
  Passed& last = last_passed;
  if (last.steps == &steps && last.bias == bias && last.allocates == allocates &&
      std::equal(call.slots, call.slots + kInputSlots, last.slots)) {
    std::copy(last.out, last.out + 4, out);
    return;
  }
  for (const GeometryStep& step : steps) {
    if ((step.needs_bias && !bias) || (step.needs_allocation && !allocates)) continue;
    Int128 value = 0;
    const bool ok = evaluate(step.program, call.slots, value);
    if (!ok || (step.kind == GeometryStep::Rule ? value == 0 : (value > kInt64Max || value < kInt64Min))) {
      c.fail(step.arg, step.clause, render(step.seen, call), render(step.fix, call));
    }
    if (step.out >= 0) out[step.out] = call.slots[kOutSlot + step.out] = static_cast<int64_t>(value);
  }
  last.steps = &steps, last.bias = bias, last.allocates = allocates;
  std::copy(call.slots, call.slots + kInputSlots, last.slots);
  std::copy(out, out + 4, last.out);
}

}  // namespace

// Runs the installed checks of `op`, then fills the Problem the kernels consume.
Problem validate(const Checker& c, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias,
                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                 std::optional<at::IntArrayRef> output_padding, int64_t groups, bool allocates) {
  const Steps* table = current_table.load(std::memory_order_acquire);
  TORCH_CHECK(table, "fuel::", c.op, ": no geometry table is installed (import fuel_torch installs it)");
  const auto steps = table->find(c.op);
  TORCH_CHECK(steps != table->end(), "fuel::", c.op, ": the geometry table has no checks for this op");
  Call call = call_of(x, weight, bias, stride, padding, dilation, output_padding, groups);
  int64_t out[4] = {0, 0, 0, 0};
  run_steps(c, steps->second, call, allocates, out);
  Problem p;
  p.transpose = output_padding.has_value();
  p.N = x.size(0), p.Cin = x.size(1), p.H = x.size(2), p.W = x.size(3);
  p.Kh = weight.size(2), p.Kw = weight.size(3);
  p.Cout = out[1], p.Ho = out[2], p.Wo = out[3], p.groups = groups;
  for (int i = 0; i < 2; ++i) {  // from the slots: in bounds even for a table that checks no length
    p.stride[i] = call.slots[kStrideSlot + i], p.padding[i] = call.slots[kPaddingSlot + i];
    p.dilation[i] = call.slots[kDilationSlot + i];
    p.output_padding[i] = p.transpose ? call.slots[kOutputPaddingSlot + i] : 0;
  }
  return p;
}

}  // namespace fuel
