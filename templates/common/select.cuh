// std::conditional without <type_traits> (NVRTC compiles these templates header-free).
#pragma once

namespace fj {

template <bool C, class A, class B>
struct Select {
  using type = A;
};
template <class A, class B>
struct Select<false, A, B> {
  using type = B;
};

}  // namespace fj
