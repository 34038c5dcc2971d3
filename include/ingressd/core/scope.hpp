#pragma once
// Scope helpers for coroutines.

namespace ingressd {

/// Publishes `obj` in `slot` for the lifetime of this object, so that another handler on the
/// same thread (a timeout, a stop request) can reach an object that lives in a coroutine frame;
/// the slot is cleared however the scope ends.
template <class T>
class registration {
 public:
  registration(T*& slot, T& obj) : slot_(slot) { slot_ = &obj; }
  ~registration() { slot_ = nullptr; }
  registration(const registration&) = delete;
  registration& operator=(const registration&) = delete;

 private:
  T*& slot_;
};

}  // namespace ingressd
