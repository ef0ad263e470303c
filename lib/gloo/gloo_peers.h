// Which peers each Gloo algorithm this backend calls exchanges data with, so that only those
// pairs are connected (lib/gloo/gloo_pairs.h).
//
// Each function mirrors the loop of the Gloo 0.5.0 source named (Debian's libgloo-dev,
// 0.0~git20220518): a peer missing from the set would make Gloo dereference an unconnected pair,
// so tests/lazy_connect_test.cc runs every op at every world size from 2 to 9 and every root.
// The sets are symmetric (r is in PeersOf(p) exactly when p is in PeersOf(r)), which is what
// lets both ends of a pair connect it at first use without asking each other.
// Every result is sorted, without duplicates and without `rank` itself.
#ifndef ADAPTCOMM_LIB_GLOO_GLOO_PEERS_H_
#define ADAPTCOMM_LIB_GLOO_GLOO_PEERS_H_

#include <vector>

namespace adaptcomm::gloo_backend {

// Ring allreduce, allgather, our ring reduce_scatter, and the reduce-scatter phase of
// gloo::reduce: rank-1 and rank+1 (mod size). allreduce.cc ring(), allgather.cc, reduce.cc.
std::vector<int> RingPeers(int rank, int size);

// gloo::broadcast: a binomial tree rooted at `root` (broadcast.cc), at most ceil(log2 size).
std::vector<int> BroadcastPeers(int rank, int size, int root);

// gloo::barrier: dissemination, rank +- 2^k (barrier.cc), at most 2 ceil(log2 size).
std::vector<int> BarrierPeers(int rank, int size);

// gloo::allreduce with BCUBE: the members of this rank's group at every step, the groups being
// size's factors of 2 and what is left (allreduce.cc bcube(), computeGroupSizePerStep with n = 2).
// log2(size) peers for a power of two; size - 1 for an odd size.
std::vector<int> BcubePeers(int rank, int size);

// Our recursive-doubling allreduce (gloo_recursive_doubling.h). A world of n = 2^k + m ranks
// first folds ranks 2i and 2i+1 (i < m) into one: the even one hands its vector to the odd one,
// which takes part for both and hands the result back. The 2^k that take part are renumbered
// densely (the odd rank of a pair as i, every rank from 2m on as rank - m) and exchange with the
// ranks whose new number differs in bit j, for j = 0 .. k-1.
struct RecursiveDoublingPlan {
  int fold_peer = -1;         // the other rank of this rank's folded pair; -1: not folded
  bool folds_out = false;     // this rank hands its vector to fold_peer and takes no other part
  std::vector<int> partners;  // the exchanges, in order (empty when folds_out)
};
RecursiveDoublingPlan PlanRecursiveDoubling(int rank, int size);
// The plan's peers: at most floor(log2 size) + 1, whatever size's factors.
std::vector<int> RecursiveDoublingPeers(int rank, int size);

// gloo::reduce: the ring, then every rank sends its chunk to the root (reduce.cc, "Gather to root
// rank"): the root talks to everyone.
std::vector<int> DirectReducePeers(int rank, int size, int root);

// gloo::alltoall: everyone.
std::vector<int> AllPeers(int rank, int size);

// One of the sets above, as an op picks it: `root` is the root of kBroadcast and kDirectReduce,
// the peer of kPair (send/recv), unused otherwise.
enum class PeerSet {
  kRing,
  kBroadcast,
  kBarrier,
  kBcube,
  kRecursiveDoubling,
  kDirectReduce,
  kAll,
  kPair
};
constexpr int kPeerSetCount = 8;
struct PeerSetId {
  PeerSet set = PeerSet::kRing;
  int root = 0;
};
std::vector<int> PeersOf(PeerSetId id, int rank, int size);

}  // namespace adaptcomm::gloo_backend

#endif  // ADAPTCOMM_LIB_GLOO_GLOO_PEERS_H_
