#include "lib/gloo/gloo_peers.h"

#include <algorithm>
#include <cstddef>

namespace adaptcomm::gloo_backend {
namespace {

std::vector<int> Normalized(std::vector<int> peers, int rank) {
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());
  return peers;
}

size_t Log2Ceil(size_t n) {
  size_t dim = 0;
  while ((size_t{1} << dim) < n) ++dim;
  return dim;
}

}  // namespace

std::vector<int> RingPeers(int rank, int size) {
  if (size < 2) return {};
  return Normalized({(rank + size - 1) % size, (rank + 1) % size}, rank);
}

std::vector<int> BroadcastPeers(int rank, int size, int root) {
  // broadcast.cc: with vrank the rank counted from the root, at step i a rank whose bits above
  // bit i are all clear talks to vrank ^ (1 << i), if that rank exists.
  const auto vsize = static_cast<size_t>(size);
  const size_t vrank = (static_cast<size_t>(rank) + vsize - static_cast<size_t>(root)) % vsize;
  const size_t dim = Log2Ceil(vsize);
  size_t mask = (size_t{1} << dim) - 1;
  std::vector<int> peers;
  for (size_t i = 0; i < dim; ++i) {
    mask ^= size_t{1} << i;
    if ((vrank & mask) != 0) continue;
    const size_t vpeer = vrank ^ (size_t{1} << i);
    if (vpeer >= vsize) continue;
    peers.push_back(static_cast<int>((vpeer + static_cast<size_t>(root)) % vsize));
  }
  return Normalized(std::move(peers), rank);
}

std::vector<int> BarrierPeers(int rank, int size) {
  std::vector<int> peers;
  for (int d = 1; d < size; d <<= 1) {
    peers.push_back((size + rank - d) % size);
    peers.push_back((rank + d) % size);
  }
  return Normalized(std::move(peers), rank);
}

std::vector<int> BcubePeers(int rank, int size) {
  // computeGroupSizePerStep(size, 2): factors of 2 first, then the rest as one group.
  std::vector<size_t> group_sizes;
  size_t left = static_cast<size_t>(size);
  while (left % 2 == 0 && left > 1) {
    group_sizes.push_back(2);
    left /= 2;
  }
  if (left > 1) group_sizes.push_back(left);
  std::vector<int> peers;
  size_t distance = 1;
  const auto r = static_cast<size_t>(rank);
  for (const size_t group_size : group_sizes) {
    const size_t group_rank = (r / distance) % group_size;
    const size_t base = r - group_rank * distance;
    for (size_t i = 0; i < group_size; ++i) peers.push_back(static_cast<int>(base + i * distance));
    distance *= group_size;
  }
  return Normalized(std::move(peers), rank);
}

RecursiveDoublingPlan PlanRecursiveDoubling(int rank, int size) {
  RecursiveDoublingPlan plan;
  if (size < 2) return plan;
  int pof2 = 1;
  while (pof2 * 2 <= size) pof2 *= 2;
  const int folded = size - pof2;  // pairs folded into one
  int new_rank = rank - folded;
  if (rank < 2 * folded) {
    plan.fold_peer = rank ^ 1;
    plan.folds_out = rank % 2 == 0;
    if (plan.folds_out) return plan;
    new_rank = rank / 2;
  }
  for (int mask = 1; mask < pof2; mask <<= 1) {
    const int partner = new_rank ^ mask;
    plan.partners.push_back(partner < folded ? 2 * partner + 1 : partner + folded);
  }
  return plan;
}

std::vector<int> RecursiveDoublingPeers(int rank, int size) {
  RecursiveDoublingPlan plan = PlanRecursiveDoubling(rank, size);
  if (plan.fold_peer >= 0) plan.partners.push_back(plan.fold_peer);
  return Normalized(std::move(plan.partners), rank);
}

std::vector<int> DirectReducePeers(int rank, int size, int root) {
  if (rank == root) return AllPeers(rank, size);
  std::vector<int> peers = RingPeers(rank, size);
  peers.push_back(root);
  return Normalized(std::move(peers), rank);
}

std::vector<int> AllPeers(int rank, int size) {
  std::vector<int> peers;
  for (int p = 0; p < size; ++p) peers.push_back(p);
  return Normalized(std::move(peers), rank);
}

std::vector<int> PeersOf(PeerSetId id, int rank, int size) {
  switch (id.set) {
    case PeerSet::kRing:
      return RingPeers(rank, size);
    case PeerSet::kBroadcast:
      return BroadcastPeers(rank, size, id.root);
    case PeerSet::kBarrier:
      return BarrierPeers(rank, size);
    case PeerSet::kBcube:
      return BcubePeers(rank, size);
    case PeerSet::kRecursiveDoubling:
      return RecursiveDoublingPeers(rank, size);
    case PeerSet::kDirectReduce:
      return DirectReducePeers(rank, size, id.root);
    case PeerSet::kAll:
      return AllPeers(rank, size);
    case PeerSet::kPair:
      return Normalized({id.root}, rank);
  }
  return {};
}

}  // namespace adaptcomm::gloo_backend
