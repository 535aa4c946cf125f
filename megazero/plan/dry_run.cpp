#include "megazero/plan/dry_run.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "megazero/plan/hardware_profile.h"
#include "megazero/plan/memory_plan.h"
#include "megazero/plan/time_model.h"

namespace megazero::plan {

void plan_virtual_world(train::TrainArgs& args, Communicator& world) {
  // Every rank reads the profile, so a bad --hardware fails them all alike.
  const auto hardware = run_consistently(world, [&] {
    if (args.hardware.empty()) return std::optional<HardwareProfile>{};
    auto hw = load_hardware_profile(args.hardware);
    // The profile says how many devices a node has: the layout is checked against it.
    auto& rpn = args.parallel.ranks_per_node;
    MZ_REQUIRE(rpn == 0 || rpn == hw.devices_per_node, "--ranks-per-node ", rpn, " differs from --hardware ", hw.name,
               "'s ", hw.devices_per_node, " devices per node: drop --ranks-per-node or pick another profile");
    rpn = hw.devices_per_node;
    args.validate_layout(args.world_size);
    return std::optional<HardwareProfile>{hw};
  });
  // Rank 0 plans and prints; an error there (say, an unwritable --plan-json) ends every rank alike.
  run_consistently(world, [&] {
    if (world.rank() != 0) return;
    std::cout << "---- resolved configuration (virtual world of " << args.world_size << " ranks) ----\n"
              << args.to_config() << std::flush;
    RankMemoryPlan plan;
    const DeviceKind kernels = hardware ? hardware->kernels : DeviceKind::CUDA;
    if (args.plan_fit_gib > 0) {
      const auto layers =
          largest_layers_that_fit(args, args.world_size, args.plan_rank,
                                  static_cast<std::int64_t>(args.plan_fit_gib * 1073741824.0), &plan, kernels);
      std::printf("largest model that fits %.1f GiB per rank: %lld layers, %.2fB parameters\n", args.plan_fit_gib,
                  static_cast<long long>(layers), static_cast<double>(plan.total_params) / 1e9);
      if (layers == 0) return;
      args.model.num_layers = layers;
    } else {
      std::int64_t least = 0;
      plan = args.plan_rank >= 0 ? plan_rank_memory(args, args.world_size, args.plan_rank, kernels)
                                 : plan_busiest_rank(args, args.world_size, &least, kernels);
      if (args.plan_rank < 0)
        std::printf("every rank planned: step peaks from %.3f to %.3f GiB; the largest, rank %d's:\n",
                    static_cast<double>(least) / 1073741824.0, static_cast<double>(plan.step_total_peak) / 1073741824.0,
                    plan.rank);
    }
    std::cout << plan.to_table();
    std::string json = "{\"plan\": " + plan.to_json();
    if (hardware) {
      const auto estimate = estimate_step_time(args, plan, *hardware);
      std::cout << estimate.to_table();
      json += ", \"estimate\": " + estimate.to_json();
    } else {
      std::cout << "  (add --hardware dgx2-v100|h100-node|h200-node|this-machine|FILE for a step-time estimate)\n";
    }
    json += "}";
    std::cout << json << "\n" << std::flush;
    if (!args.plan_json.empty()) {
      std::ofstream out(args.plan_json, std::ios::trunc);
      out << json << "\n";
      MZ_REQUIRE(out.good(), "--plan-json: cannot write '", args.plan_json, "'");
    }
  });
}

}  // namespace megazero::plan
