// fuel_torch._C: loading it registers the ops (TORCH_LIBRARY); its one Python function receives the
// parsed contracts.
#include <torch/extension.h>

#include "contract_rules.h"
#include "cpu_capability.h"

namespace {

c10::ScalarType scalar_type_of(const std::string& fkc_name) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
  auto it = types.find(fkc_name);
  TORCH_CHECK(it != types.end(), "fuel_torch: contract dtype ", fkc_name, " has no kernel");
  return it->second;
}

// rules: [{kernel, op, dtype, dtype_rule, shape_rule, layout_guarantee, aliasing,
//          inputs: [{name, dtypes, layout: {flag: value}, rank, optional, same_as}]}]
void install_rules(const py::list& rules) {
  std::vector<fuel::KernelRule> parsed;
  for (const auto& item : rules) {
    const auto rule = item.cast<py::dict>();
    fuel::KernelRule k;
    k.kernel = rule["kernel"].cast<std::string>();
    k.op = rule["op"].cast<std::string>();
    k.dtype = scalar_type_of(rule["dtype"].cast<std::string>());
    k.dtype_rule = rule["dtype_rule"].cast<std::string>();
    k.shape_rule = rule["shape_rule"].cast<std::string>();
    k.layout_guarantee = rule["layout_guarantee"].cast<std::string>();
    k.aliasing = rule["aliasing"].cast<std::string>();
    for (const auto& entry : rule["inputs"].cast<py::list>()) {
      const auto input = entry.cast<py::dict>();
      fuel::InputRule in;
      in.name = input["name"].cast<std::string>();
      for (const auto& d : input["dtypes"].cast<std::vector<std::string>>()) in.dtypes.push_back(scalar_type_of(d));
      in.layout = input["layout"].cast<std::map<std::string, std::string>>();
      in.rank = input["rank"].cast<int64_t>();
      in.optional = input["optional"].cast<bool>();
      in.same_as = input["same_as"].cast<std::string>();
      k.inputs.push_back(std::move(in));
    }
    parsed.push_back(std::move(k));
  }
  fuel::install_rules(std::move(parsed));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install_rules", &install_rules, "Install the accept/return clauses parsed from contracts/.");
  fuel::bind_cpu_capability(m);
}
