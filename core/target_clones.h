// BAGPIPE_TARGET_CLONES("avx2", "default") before a function compiles a copy of it per
// instruction set (GCC's target_clones); the dynamic loader's ifunc resolver picks one when the
// program starts. Sanitizer builds define BAGPIPE_NO_TARGET_CLONES (cmake/BagpipeSanitizers.cmake)
// and get the one default copy: the resolver runs before the sanitizer runtime is initialised,
// which ThreadSanitizer does not survive.
#ifndef BAGPIPE_CORE_TARGET_CLONES_H_
#define BAGPIPE_CORE_TARGET_CLONES_H_

#if defined(BAGPIPE_NO_TARGET_CLONES)
#define BAGPIPE_TARGET_CLONES(...)
#else
#define BAGPIPE_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#endif

#endif  // BAGPIPE_CORE_TARGET_CLONES_H_
