// Optional fields of a kernel Spec. Codegen's prelude names every field, but test harnesses and
// older generated sources may leave the newer ones out; a kernel reads such a field through a
// trait that falls back to the field's default:
//   FJ_SPEC_FLAG(TraitName, FIELD, default)  ->  TraitName<Spec>::value  (bool)
//   FJ_SPEC_INT(TraitName, FIELD, default)   ->  TraitName<Spec>::value  (int)
#pragma once

#define FJ_SPEC_FIELD(TRAIT, TYPE, FIELD, DEFAULT) \
  template <class S, class = void>                 \
  struct TRAIT {                                   \
    static constexpr TYPE value = DEFAULT;         \
  };                                               \
  template <class S>                               \
  struct TRAIT<S, decltype(void(S::FIELD))> {      \
    static constexpr TYPE value = S::FIELD;        \
  }
#define FJ_SPEC_FLAG(TRAIT, FIELD, DEFAULT) FJ_SPEC_FIELD(TRAIT, bool, FIELD, DEFAULT)
#define FJ_SPEC_INT(TRAIT, FIELD, DEFAULT) FJ_SPEC_FIELD(TRAIT, int, FIELD, DEFAULT)
