// The one switch over OpKind a backend needs: OpDispatch::Run(kind, impl, args...) calls the
// member of `impl` that runs `kind` (impl.Allreduce(args...), impl.Broadcast, impl.Reduce,
// impl.Allgather, impl.ReduceScatter, impl.Alltoall, impl.Barrier, impl.Send, impl.Recv), so a
// backend writes one member per op instead of its own switch. Every member takes the same
// arguments and returns the same type: void or absl::Status (a kind outside the enum, which
// Supports() refuses first, then returns InvalidArgument or nothing).
// A class whose members are private names it a friend: `friend struct ::adaptcomm::OpDispatch;`.
#ifndef ADAPTCOMM_LIB_BACKEND_OP_DISPATCH_H_
#define ADAPTCOMM_LIB_BACKEND_OP_DISPATCH_H_

#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/ext/backend.h"

namespace adaptcomm {

struct OpDispatch {
  template <typename Impl, typename... Args>
  static decltype(auto) Run(OpKind kind, Impl& impl, Args&&... args) {
    switch (kind) {
      case OpKind::kAllreduce:
        return impl.Allreduce(std::forward<Args>(args)...);
      case OpKind::kBroadcast:
        return impl.Broadcast(std::forward<Args>(args)...);
      case OpKind::kReduce:
        return impl.Reduce(std::forward<Args>(args)...);
      case OpKind::kAllgather:
        return impl.Allgather(std::forward<Args>(args)...);
      case OpKind::kReduceScatter:
        return impl.ReduceScatter(std::forward<Args>(args)...);
      case OpKind::kAlltoall:
        return impl.Alltoall(std::forward<Args>(args)...);
      case OpKind::kBarrier:
        return impl.Barrier(std::forward<Args>(args)...);
      case OpKind::kSend:
        return impl.Send(std::forward<Args>(args)...);
      case OpKind::kRecv:
        return impl.Recv(std::forward<Args>(args)...);
    }
    using Result = decltype(impl.Allreduce(std::forward<Args>(args)...));
    static_assert(std::is_void_v<Result> || std::is_same_v<Result, absl::Status>,
                  "OpDispatch: the members return void or absl::Status");
    if constexpr (!std::is_void_v<Result>) {
      return absl::InvalidArgumentError(absl::StrCat("unknown op kind ", static_cast<int>(kind)));
    }
  }
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BACKEND_OP_DISPATCH_H_
