#include "contract_rules.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>

namespace fuel {
namespace {

// std::less<> lets find() take a string_view without building a std::string.
using Table = std::map<std::string, std::vector<KernelRule>, std::less<>>;

std::mutex install_mutex;
// Tables are never freed: a call in flight may hold a reference into an older one while a new
// table is installed (only fuel_torch's import installs one, so this is a handful of bytes).
std::vector<std::unique_ptr<Table>> all_tables;
std::atomic<const Table*> current_table{nullptr};

const Table& table() {
  static const Table empty;
  const Table* installed = current_table.load(std::memory_order_acquire);
  return installed ? *installed : empty;
}

template <typename Parts>
std::string join(const Parts& parts, const char* sep) {
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) joined += (i ? sep : "") + parts[i];
  return joined;
}

std::string fkc_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    default: return dtype_str(dtype);
  }
}

std::string layout_seen(const at::Tensor& t) {
  return "shape " + shape_str(t.sizes()) + ", strides " + shape_str(t.strides()) +
         ", storage offset " + std::to_string(t.storage_offset());
}

const char* kLayoutFix = "pass a contiguous zero-offset copy (.contiguous() or .clone()), or call through "
                         "fuel_torch under layout_policy('contiguize')";
// The fixes where the kernels also read channels_last: the convolutions, whose nn modules apply the
// policy to their parameters too. Each names only what works for the clause broken: .contiguous()
// returns an offset tensor unchanged, so an offset needs .clone(). Twins in fuel_torch/enforce.py.
const char* kLayoutFixChannelsLast =
    "pass a contiguous or channels_last copy (.contiguous(), .contiguous(memory_format=torch.channels_last) "
    "or .clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize')";
const char* kOffsetFixChannelsLast =
    "pass a zero-offset copy (.clone()), or call through the fuel_torch API or a fuel_torch.nn module under "
    "layout_policy('contiguize')";

// The ops whose kernels read a 4-d channels_last (NHWC) operand in place; twin of
// READS_CHANNELS_LAST in fuel_torch/enforce.py.
bool reads_channels_last(std::string_view op) {
  return op == "conv2d" || op == "conv_transpose2d";
}

// A 4-d tensor laid out as torch.channels_last (NHWC in memory) and not plain contiguous.
bool is_channels_last(const at::Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// The first layout clause `t` breaks, most specific first; nullptr when it breaks none. A tensor with
// no elements has no memory to read, so no layout can be wrong for it (torch calls it contiguous).
const char* broken_layout_clause(const at::Tensor& t, const InputRule& in) {
  if (t.numel() == 0) return nullptr;
  bool negative = false, stride0 = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    negative |= t.stride(d) < 0;
    stride0 |= t.stride(d) == 0 && t.size(d) > 1;
  }
  if (negative && in.rejects_reverse_strides) return "layout.reverse_strides: rejected";
  if (stride0 && in.rejects_broadcast_stride0) return "layout.broadcast_stride0: rejected";
  if (t.storage_offset() != 0 && in.rejects_start_offset) return "layout.start_offset: rejected";
  if (!t.is_contiguous()) {
    if (in.accepts_channels_last && is_channels_last(t)) return nullptr;
    if (in.rejects_strided) return "layout.strided: rejected";
    if (in.requires_contiguous) return "layout.contiguous: required";
  }
  return nullptr;
}

// What the kernels can really read, whatever a contract claims: a contract that accepts more than
// this (a draft, a typo) must never turn into an out-of-bounds read.
bool kernel_can_read(const at::Tensor& t, std::string_view op) {
  const bool dense = t.is_contiguous() || (reads_channels_last(op) && is_channels_last(t));
  return t.numel() == 0 || (dense && t.storage_offset() == 0);
}

bool is_missing(const at::Tensor* t) { return t == nullptr || !t->defined(); }

std::string all_kernels(const std::vector<KernelRule>& kernels) {
  std::vector<std::string> names;
  for (const auto& k : kernels) names.push_back(k.kernel);
  return join(names, "|");
}

// A required tensor passed as None (Python None becomes an undefined tensor on its way to a kernel).
// The kernel named is the one the first present tensor's dtype selects, as the dtype check would.
[[noreturn]] void fail_missing(std::string_view op, const std::vector<KernelRule>& kernels,
                               c10::ArrayRef<const at::Tensor*> inputs, const std::string& arg) {
  std::string kernel = all_kernels(kernels);
  for (const at::Tensor* t : inputs) {
    if (is_missing(t)) continue;
    for (const auto& k : kernels) {
      if (k.dtype == t->scalar_type()) kernel = k.kernel;
    }
    break;
  }
  fail(op, kernel, arg, "optional: false", "None", "pass a tensor");
}

[[noreturn]] void fail_dtype(std::string_view op, const std::vector<KernelRule>& kernels, const at::Tensor& first) {
  std::vector<std::string> dtype_names;
  for (const auto& k : kernels) dtype_names.push_back(fkc_dtype_name(k.dtype));
  fail(op, all_kernels(kernels), kernels.front().inputs.at(0).name, "dtypes: [" + join(dtype_names, ", ") + "]",
       dtype_str(first.scalar_type()),
       "convert the tensors to one of torch.float32, torch.float64, torch.bfloat16, torch.float16");
}

}  // namespace

std::string shape_str(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "]";
  return os.str();
}

std::string dtype_str(c10::ScalarType dtype) {
  return "torch." + std::string(c10::getDtypeNames(dtype).first);
}

void install_rules(std::vector<KernelRule> rules) {
  auto fresh = std::make_unique<Table>();
  for (auto& rule : rules) {
    for (auto& in : rule.inputs) {
      auto is = [&](const char* flag, const char* value) {
        auto it = in.layout.find(flag);
        return it != in.layout.end() && it->second == value;
      };
      in.rejects_reverse_strides = is("reverse_strides", "rejected");
      in.rejects_broadcast_stride0 = is("broadcast_stride0", "rejected");
      in.rejects_start_offset = is("start_offset", "rejected");
      in.rejects_strided = is("strided", "rejected");
      in.requires_contiguous = is("contiguous", "required");
      in.accepts_channels_last = is("channels_last", "accepted");
      in.same_as_index = -1;
      for (size_t j = 0; j < rule.inputs.size() && !in.same_as.empty(); ++j) {
        if (rule.inputs[j].name == in.same_as) in.same_as_index = static_cast<int64_t>(j);
      }
    }
    std::string op = rule.op;
    (*fresh)[op].push_back(std::move(rule));
  }
  std::lock_guard<std::mutex> lock(install_mutex);
  current_table.store(fresh.get(), std::memory_order_release);
  all_tables.push_back(std::move(fresh));
}

void fail(std::string_view op, std::string_view kernel, std::string_view arg, std::string_view clause,
          std::string_view seen, std::string_view fix) {
  TORCH_CHECK(false, "fuel::", op, " [", kernel, "]: argument '", arg, "' breaks `", clause, "`: saw ", seen,
              ". Fix: ", fix, ".");
}

const KernelRule& check_inputs(std::string_view op, c10::ArrayRef<const at::Tensor*> inputs) {
  const Table& rules = table();
  auto found = rules.find(op);
  TORCH_CHECK(found != rules.end() && !found->second.empty() && !inputs.empty(),
              "fuel::", op, ": no contract is installed for this op; import fuel_torch before calling torch.ops.fuel.*");
  const auto& kernels = found->second;
  const auto& names = kernels.front().inputs;
  TORCH_CHECK(inputs.size() == names.size(), "fuel::", op, " [", kernels.front().kernel, "]: contract lists ",
              names.size(), " inputs but the op passed ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (is_missing(inputs[i]) && !(inputs[i] == nullptr && names[i].optional)) {
      fail_missing(op, kernels, inputs, names[i].name);
    }
  }
  const at::Tensor& first = *inputs[0];
  const std::string& first_name = names[0].name;

  const KernelRule* rule = nullptr;
  for (const auto& k : kernels) {
    if (k.dtype == first.scalar_type()) rule = &k;
  }
  if (!rule) fail_dtype(op, kernels, first);

  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputRule& in = rule->inputs[i];
    const at::Tensor* t = inputs[i];
    if (!t) continue;  // an absent optional (a missing required one was refused above)
    if (t->device() != first.device() || !t->device().is_cpu()) {
      fail(op, rule->kernel, in.name, "backend: Cpu",
           "device " + t->device().str() + " ('" + first_name + "' is on " + first.device().str() + ")",
           "move every tensor of the call to the CPU (meta tensors only for shape inference, all of them meta)");
    }
    if (std::find(in.dtypes.begin(), in.dtypes.end(), t->scalar_type()) == in.dtypes.end()) {
      std::vector<std::string> dtype_names;
      for (auto d : in.dtypes) dtype_names.push_back(fkc_dtype_name(d));
      fail(op, rule->kernel, in.name, "dtypes: [" + join(dtype_names, ", ") + "]", dtype_str(t->scalar_type()),
           "convert '" + in.name + "' to " + dtype_str(rule->dtype) + " (every tensor of one call has one dtype)");
    }
    const char* clause = broken_layout_clause(*t, in);
    if (!clause && !kernel_can_read(*t, op)) clause = "layout.contiguous: required";
    if (clause) {
      const char* fix = !reads_channels_last(op)                                   ? kLayoutFix
                        : std::string_view(clause) == "layout.start_offset: rejected" ? kOffsetFixChannelsLast
                                                                                      : kLayoutFixChannelsLast;
      fail(op, rule->kernel, in.name, clause, layout_seen(*t), fix);
    }
    if (in.rank >= 0 && t->dim() != in.rank) {
      fail(op, rule->kernel, in.name, "rank: " + std::to_string(in.rank),
           "rank " + std::to_string(t->dim()) + " (shape " + shape_str(t->sizes()) + ")",
           "pass a " + std::to_string(in.rank) + "-d tensor");
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputRule& in = rule->inputs[i];
    const int64_t j = in.same_as_index;
    if (j < 0 || !inputs[i] || !inputs[j] || inputs[j]->sizes() == inputs[i]->sizes()) continue;
    fail(op, rule->kernel, in.name, "shape_constraint: same_as=" + in.same_as,
         in.name + " " + shape_str(inputs[i]->sizes()) + ", " + in.same_as + " " + shape_str(inputs[j]->sizes()),
         "pass tensors of one shape (the kernel does not broadcast), or call through fuel_torch under "
         "layout_policy('contiguize'), which broadcasts first");
  }
  return *rule;
}

void check_out(const KernelRule& rule, const at::Tensor& out, c10::ScalarType dtype, at::IntArrayRef shape,
               c10::ArrayRef<const at::Tensor*> inputs) {
  const std::string& op = rule.op;
  if (!out.defined()) fail(op, rule.kernel, "out", "optional: false", "None", "pass a tensor");
  const at::Tensor& first = *inputs.at(0);
  if (out.device() != first.device()) {
    fail(op, rule.kernel, "out", "backend: Cpu",
         "device " + out.device().str() + " ('" + rule.inputs.at(0).name + "' is on " + first.device().str() + ")",
         "allocate out on the device of the inputs");
  }
  if (out.scalar_type() != dtype) {
    fail(op, rule.kernel, "out", "return.dtype_rule: " + rule.dtype_rule, dtype_str(out.scalar_type()),
         "allocate out with dtype " + dtype_str(dtype) + " (.out never casts)");
  }
  if (out.sizes() != shape) {
    fail(op, rule.kernel, "out", "return.shape_rule: " + rule.shape_rule,
         "shape " + shape_str(out.sizes()) + ", expected " + shape_str(shape),
         "allocate out with shape " + shape_str(shape) + " (.out never resizes)");
  }
  if (!kernel_can_read(out, op)) {
    fail(op, rule.kernel, "out", "return.layout_guarantee: " + rule.layout_guarantee, layout_seen(out),
         "pass a fresh contiguous zero-offset tensor as out");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor* in = inputs[i];
    if (in && out.numel() > 0 && in->numel() > 0 && out.storage().is_alias_of(in->storage())) {
      fail(op, rule.kernel, "out", "return.aliasing: " + rule.aliasing,
           "out shares memory with '" + rule.inputs.at(i).name + "'", "write into a tensor that no input uses");
    }
  }
}

}  // namespace fuel
