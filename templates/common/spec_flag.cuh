// Optional boolean fields of a kernel Spec. Codegen's prelude names every field, but test
// harnesses and older generated sources may leave the newer ones out; a kernel reads such a
// field through a trait that falls back to the field's default:
//   FJ_SPEC_FLAG(TraitName, FIELD, default)  ->  TraitName<Spec>::value
#pragma once

#define FJ_SPEC_FLAG(TRAIT, FIELD, DEFAULT)   \
  template <class S, class = void>            \
  struct TRAIT {                              \
    static constexpr bool value = DEFAULT;    \
  };                                          \
  template <class S>                          \
  struct TRAIT<S, decltype(void(S::FIELD))> { \
    static constexpr bool value = S::FIELD;   \
  }
