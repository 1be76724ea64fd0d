// fuel_torch._C: loading it registers the ops (TORCH_LIBRARY); install_rules and install_geometry
// receive the parsed contracts and the compiled geometry table.
#include <torch/extension.h>

#include "contract_rules.h"
#include "convolution/geometry.h"
#include "cpu_capability.h"
#include "dispatch.h"
#include "kernels/peak_probe.h"

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

fuel::Program program_of(const py::handle& code) {
  fuel::Program program;
  for (const auto& entry : code.cast<py::tuple>()) {
    const auto instr = entry.cast<py::tuple>();
    program.push_back({fuel::opcode_named(instr[0].cast<std::string>()), instr[1].cast<int64_t>()});
  }
  return program;
}

fuel::Template template_of(const py::handle& parts) {
  static const std::map<std::string, fuel::Segment::Kind> kinds = {
      {"text", fuel::Segment::Text}, {"shape", fuel::Segment::Shape}, {"list", fuel::Segment::List},
      {"value", fuel::Segment::Value}, {"dtype", fuel::Segment::Dtype}};
  fuel::Template result;
  for (const auto& entry : parts.cast<py::tuple>()) {
    const auto part = entry.cast<py::tuple>();
    const auto kind = kinds.find(part[0].cast<std::string>());
    TORCH_CHECK(kind != kinds.end(), "fuel_torch: unknown geometry message part ", part[0].cast<std::string>());
    fuel::Segment segment;
    segment.kind = kind->second;
    if (segment.kind == fuel::Segment::Text) segment.text = part[1].cast<std::string>();
    if (segment.kind == fuel::Segment::Shape || segment.kind == fuel::Segment::List) {
      segment.index = part[1].cast<int64_t>();
    }
    if (segment.kind == fuel::Segment::Value) segment.program = program_of(part[1]);
    result.push_back(std::move(segment));
  }
  return result;
}

// steps: {op: [{kind, name, arg, clause, program, seen, fix, needs_bias, out, needs_allocation,
// never_guard}]}, as fuel_torch/geometry.py's Table.for_cpp() gives them (never_guard concerns the
// symbolic sizes of the fake kernels only: C++ sees real sizes).
void install_geometry(const py::dict& table) {
  static const std::map<std::string, fuel::GeometryStep::Kind> kinds = {
      {"rule", fuel::GeometryStep::Rule}, {"fits", fuel::GeometryStep::Fits}, {"out", fuel::GeometryStep::Out}};
  std::map<std::string, std::vector<fuel::GeometryStep>> parsed;
  for (const auto& [op, steps] : table) {
    auto& list = parsed[op.cast<std::string>()];
    for (const auto& entry : steps.cast<py::list>()) {
      const auto raw = entry.cast<py::dict>();
      const auto kind = kinds.find(raw["kind"].cast<std::string>());
      TORCH_CHECK(kind != kinds.end(), "fuel_torch: unknown geometry step kind ", raw["kind"].cast<std::string>());
      fuel::GeometryStep step;
      step.kind = kind->second;
      step.arg = raw["arg"].cast<std::string>();
      step.clause = raw["clause"].cast<std::string>();
      step.program = program_of(raw["program"]);
      step.seen = template_of(raw["seen"]);
      step.fix = template_of(raw["fix"]);
      step.needs_bias = raw["needs_bias"].cast<bool>();
      step.needs_allocation = raw["needs_allocation"].cast<bool>();
      step.out = raw["out"].cast<int>();
      list.push_back(std::move(step));
    }
  }
  fuel::install_geometry(std::move(parsed));
}

}  // namespace

namespace fuel {
bool scratch_poisoned();  // convolution/scratch.cpp
void streaming_triad(const at::Tensor& lhs, const at::Tensor& rhs, const at::Tensor& out);  // elementwise.cpp

FUEL_DECLARE_KERNELS(PeakProbes, peak_probes)

double peak_probe(const std::string& dtype, int64_t iterations) {
  TORCH_CHECK(iterations >= 0 && iterations <= (int64_t(1) << 28), "fuel_torch._C.peak_probe: iterations must lie in ",
              "[0, 2^28] (at most about a second), saw ", iterations);
  const PeakProbes& probes = FUEL_KERNELS_FOR_CPU(peak_probes);
  if (dtype == "float32") return probes.float32(iterations);
  if (dtype == "float64") return probes.float64(iterations);
  TORCH_CHECK(false, "fuel_torch._C.peak_probe: dtype must be 'float32' or 'float64', saw '", dtype, "'");
}
}  // namespace fuel

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("streaming_triad", &fuel::streaming_triad,
        "out = lhs + rhs (float32, contiguous, equal sizes) with non-temporal stores at every size: the Judge's "
        "bandwidth roof for two reads and a write that need no read for ownership.");
  m.def("peak_probe", &fuel::peak_probe, py::arg("dtype"), py::arg("iterations"),
        py::call_guard<py::gil_scoped_release>(),
        "Runs `iterations` rounds of independent fused multiply-adds of the level's vectors ('float32' or "
        "'float64') on each of torch's threads and returns the floating-point operations done: the Judge's "
        "compute roof where torch.mm does not reach the vectors' rate.");
  m.def("install_rules", &install_rules, "Install the accept/return clauses parsed from contracts/.");
  m.def("install_geometry", &install_geometry,
        "Install the convolution geometry checks compiled from contracts/convolution.geometry.yaml.");
  m.def("scratch_poisoned", &fuel::scratch_poisoned,
        "Whether the convolution kernels' scratch buffers start as NaN in this process (FUEL_POISON_SCRATCH=1, "
        "read once): the tests' check that no kernel reads scratch it did not write.");
  fuel::bind_cpu_capability(m);
}
