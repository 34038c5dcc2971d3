#pragma once
// Where a request goes, decided from plain data (the seam Envoy's chooseHost and Pingora's
// upstream_peer give): which upstream serves it (contract §4.3) and in which order the routers of
// its app are tried (§4.2). Sans-I/O: the session reads the node-wide upstream states and the
// worker's router memory into these inputs, acts on the answer, and records what happened.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include <boost/container/small_vector.hpp>

#include "ingressd/routing/router_memory.hpp"

namespace ingressd::routing {

/// One replica of the app as the chooser sees it.
struct candidate {
  bool up = true;                ///< not marked down (active checks, passive health)
  std::uint32_t in_flight = 0;   ///< requests at it now, node-wide
  bool tried = false;            ///< this request could not connect to it already
};

/// Where one request goes next.
struct choice {
  enum class kind : std::uint8_t {
    replica,   ///< replicas[index]
    fallback,  ///< the app's fallback target
    none,      ///< nowhere: no_healthy_replica before any attempt, upstream_error after one
  };
  kind what = kind::none;
  std::size_t index = 0;
  bool operator==(const choice&) const = default;
};

/// What the request brings to the choice.
struct choice_inputs {
  std::optional<std::size_t> pinned;  ///< the replica the router named
  bool prefer_fallback = false;       ///< the fallback first: the router named a replica unknown here,
                                      ///< or the app had no healthy replica when routing began
  bool fallback_usable = false;       ///< the app has a fallback target and it is up
  bool tried_any = false;             ///< some upstream refused this request already
  std::size_t start = 0;              ///< where ties among equally loaded replicas start (a rotor)
};

/// The pinned replica while it is up and not tried; else the least-loaded replica that is up and
/// not tried (ties: the first from `start` on, in rotation); the fallback comes first with
/// `prefer_fallback`, and last in any case, but only before anything was tried (a request that
/// was refused does not end at the head node's proxy). None when nothing qualifies.
choice choose_upstream(std::span<const candidate> replicas, const choice_inputs& in) noexcept;

/// The order in which one request tries the `states.size()` routers of its app's pool: pool
/// order from the cursor's `start`, routers that keep losing hedged races (state::slow) after the
/// others, routers that failed recently (router_memory::state::down)
/// after all the others (contract §4.2: each at most once).
boost::container::small_vector<std::size_t, 8> router_attempt_order(std::span<const router_memory::state> states,
                                                                    std::size_t start);

}  // namespace ingressd::routing
