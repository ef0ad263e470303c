// ADAPTCOMM_EXPORT marks the public API: the classes and functions of include/adaptcomm that
// libadaptcomm.so exports. The library's layers are compiled with -fvisibility=hidden
// -fvisibility-inlines-hidden (cmake/AdaptcommLayers.cmake) and linked with a version script
// (lib/exports.map), so nothing else they define leaves the library; tests/exports.cmake fails when
// a symbol outside the public API is exported, or a public one is not.
//
// Mark each class that the library defines members of (and the interfaces whose typeinfo a
// trainer's code shares with the library: backend.h, store.h) and each free function the library
// defines. Plain structs with only inline members need no mark.
//
// Compiles as C++17: trainers include it.
#ifndef ADAPTCOMM_EXPORT_H_
#define ADAPTCOMM_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define ADAPTCOMM_EXPORT [[gnu::visibility("default")]]
#else
#define ADAPTCOMM_EXPORT
#endif

#endif  // ADAPTCOMM_EXPORT_H_
