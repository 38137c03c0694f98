#include "parallel/communicator.h"

#include "tensor/dispatch.h"

namespace frugal::parallel {

void reduce_in_rank_order(DType dtype, const std::vector<const void*>& src, void* dst, int64_t count, ReduceOp op,
                          const char* op_name) {
  dispatch_numeric(dtype, op_name, kCPU, [&]<typename T>() {
    using Acc = opmath_t<T>;
    const Acc n = Acc(src.size());
    T* out = static_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      Acc acc = Acc(static_cast<const T*>(src[0])[i]);
      for (size_t r = 1; r < src.size(); ++r) {
        const Acc x = Acc(static_cast<const T*>(src[r])[i]);
        if (op == ReduceOp::Max) acc = (x > acc || x != x) ? x : acc;  // NaN propagates, as in torch.max
        else acc = acc + x;
      }
      out[i] = T(op == ReduceOp::Avg ? Acc(acc / n) : acc);
    }
  });
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

// The threads backend's sends complete at once (buffered), so send-then-recv cannot block.
std::pair<std::shared_ptr<Work>, std::shared_ptr<Work>> Communicator::send_recv(const Tensor& to_send, int send_peer,
                                                                                const Tensor& to_recv, int recv_peer) {
  auto sent = send(to_send, send_peer);
  return {std::move(sent), recv(to_recv, recv_peer)};
}

ParallelGroups make_groups(const std::shared_ptr<Communicator>& world, int tp, int pp, int dp) {
  FRUGAL_CHECK(world != nullptr, "make_groups: null world communicator");
  FRUGAL_CHECK(tp >= 1 && pp >= 1 && dp >= 1 && tp * pp * dp == world->size(), "make_groups: tp ", tp, " x pp ", pp,
               " x dp ", dp, " must equal the world size ", world->size());
  // rank = (dp_rank * pp + pp_rank) * tp + tp_rank (Megatron order: tensor-parallel peers adjacent).
  ParallelGroups g;
  g.world = world;
  const int r = world->rank();
  g.tp_rank = r % tp;
  g.pp_rank = (r / tp) % pp;
  g.dp_rank = r / (tp * pp);
  // Each split is a collective over the world: every rank makes all three, in this order.
  // A group's color is the index of the coordinates its members share; its key orders them.
  g.tensor = world->split(g.dp_rank * pp + g.pp_rank, g.tp_rank);
  g.pipeline = world->split(g.dp_rank * tp + g.tp_rank, g.pp_rank);
  g.data = world->split(g.pp_rank * tp + g.tp_rank, g.dp_rank);
  return g;
}

}  // namespace frugal::parallel
