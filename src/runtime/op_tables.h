// Internal: the function tables behind registry rows, one shape per op family.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "smla/context.h"
#include "smla/registry.h"
#include "smla/status.h"

namespace smla::runtime {

// An implementation's plan for one problem: shapes only, reusable for every
// call of the same shapes (layers, steps, graph replays).
struct PlanState {
  std::size_t workspace_bytes = 0;
  std::shared_ptr<const void> data;  // the implementation's own plan (nullptr when it has none)
  // One line on the layout, formatted only when asked (AttentionPlan::describe); nullptr: none.
  std::string (*describe)(const PlanState& plan) = nullptr;
};

// Ops that plan once and run many times (the attention ops). Args are
// validated and Shape derived by the op's front end before run is called.
template <class Args, class Shape>
struct PlannedFunctions {
  Expected<PlanState> (*plan)(const Context& context, const Problem& problem) = nullptr;  // nullptr: no plan, no scratch
  Status (*run)(const Context& context, const PlanState& plan, const Args& args, const Shape& shape,
                void* scratch) = nullptr;
};

// Ops that run in one call: validated args and shape, scratch of
// workspace_size bytes (nullptr workspace_size: none).
template <class Args, class Shape>
struct OpFunctions {
  Expected<std::size_t> (*workspace_size)(const Context& context, const Args& args, const Shape& shape) = nullptr;
  Status (*run)(const Context& context, const Args& args, const Shape& shape, void* scratch) = nullptr;
};

}  // namespace smla::runtime
