#include "fourway/mesh/policies.hpp"

#include <gtest/gtest.h>

#include <type_traits>

namespace fw = fourway;

static_assert(fw::policy<fw::DataParallel> && fw::policy<fw::Sharded<3>>);
static_assert(fw::policy<fw::TensorParallel<fw::dynamic>> && fw::policy<fw::Pipeline<4, 8>>);
static_assert(!fw::policy<int>);
static_assert(fw::Sharded<2>::stage == 2 && fw::DataParallel::stage == 0);
// What each data-parallel policy shards, against the ZeRO paper's stage table (Rajbhandari et
// al. 2020, §5): P_os, P_os+g, P_os+g+p.
static_assert(!fw::DataParallel::shards_optimizer_state && !fw::DataParallel::shards_grads &&
              !fw::DataParallel::shards_params);
static_assert(fw::Sharded<1>::shards_optimizer_state && !fw::Sharded<1>::shards_grads &&
              !fw::Sharded<1>::shards_params);
static_assert(fw::Sharded<2>::shards_optimizer_state && fw::Sharded<2>::shards_grads &&
              !fw::Sharded<2>::shards_params);
static_assert(fw::Sharded<3>::shards_optimizer_state && fw::Sharded<3>::shards_grads &&
              fw::Sharded<3>::shards_params);
static_assert(fw::zero_sharding(2).shards_grads && !fw::zero_sharding(2).shards_params);
static_assert(fw::Sharded<1>::degree == fw::dynamic && fw::DataParallel::degree == fw::dynamic);
static_assert(fw::TensorParallel<4>::degree == 4 && fw::TensorParallel<4>::axis == fw::Axis::tp);
static_assert(fw::Pipeline<4, 8>::stages == 4 && fw::Pipeline<4, 8>::micro_batches == 8);
static_assert(std::is_same_v<fw::Pipeline<4, 8>::schedule, fw::OneFOneB>);
static_assert(
    std::is_same_v<fw::Pipeline<4, 2, fw::GPipe>::schedule, fw::GPipe>);  // M < S is fine for GPipe
static_assert(fw::Pipeline<fw::dynamic, 2>::degree == fw::dynamic);

TEST(Policies, NamesAndAxes) {
  EXPECT_EQ(fw::axis_name(fw::Axis::pp), "pp");
  EXPECT_EQ(fw::OneFOneB::name, "1F1B");
  EXPECT_EQ((fw::Pipeline<2, 4>::axis), fw::Axis::pp);
  EXPECT_EQ(fw::Sharded<3>::axis, fw::Axis::dp);
}
