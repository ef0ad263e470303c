# ADAPTCOMM_SANITIZE=address builds everything with ASan+UBSan; =thread with TSan.
# Presets: `cmake --preset asan|tsan`, `cmake --build --preset asan|tsan`, `ctest --preset asan|tsan`
# (CMakePresets.json; the test presets set the runtime options and the suppression files
# tests/tsan.supp and tests/lsan.supp, and exclude the labels soak|fuzz_long). The tsan test preset
# also excludes TimelineEndToEndTest.SlowedRankIsRankedFirstInTheHeatmap and
# .CommunicatorTracesWhenEnabledByEnv: they assert that a 30 ms delay dominates per-rank lateness,
# which TSan's slowdown of 4 threaded ranks on 2 cores swamps.
if(ADAPTCOMM_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  # GCC 12's -Wmaybe-uninitialized misfires under -fsanitize=address (std::regex's _StateT in
  # libstdc++ headers fails the -Werror build); the default build keeps the warning.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
  add_link_options(-fsanitize=address,undefined)
elseif(ADAPTCOMM_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)

  # Debian's libabsl is not built with TSan, so TSan does not see absl::Mutex & co. synchronize.
  # Every link wraps absl's out-of-line synchronization functions (our calls, including those that
  # absl's inline MutexLock & co. compile into our objects, go to __wrap_<symbol>), and
  # lib/base/tsan_absl_wrap.cc, compiled into the bottom layer (so into libadaptcomm.so, which
  # exports the wrappers, into adaptcomm_internal and into every program or plugin that links any
  # layer), annotates them for TSan. This list must match the symbols defined
  # in lib/base/tsan_absl_wrap.cc.
  set(ADAPTCOMM_TSAN_ABSL_WRAPPED
    _ZN4absl7debian35Mutex4LockEv
    _ZN4absl7debian35Mutex6UnlockEv
    _ZN4absl7debian35Mutex7TryLockEv
    _ZN4absl7debian35Mutex10ReaderLockEv
    _ZN4absl7debian35Mutex12ReaderUnlockEv
    _ZN4absl7debian35Mutex13ReaderTryLockEv
    _ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE
    _ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE
    _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE
    _ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE
    _ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE
    _ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE
    _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE
    _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE
    _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE
    _ZN4absl7debian35MutexD1Ev
    _ZN4absl7debian35MutexD2Ev
    _ZN4absl7debian319ReleasableMutexLock7ReleaseEv
    _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE
    _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE
    _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE
    _ZN4absl7debian312Notification6NotifyEv
    _ZNK4absl7debian312Notification19WaitForNotificationEv
    _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE
    _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE
    _ZN4absl7debian315BlockingCounter14DecrementCountEv
    _ZN4absl7debian315BlockingCounter4WaitEv
    _ZN4absl7debian37Barrier5BlockEv)
  foreach(sym ${ADAPTCOMM_TSAN_ABSL_WRAPPED})
    add_link_options(-Wl,--wrap=${sym})
  endforeach()
  # A program whose own objects call no absl synchronization still links shared abseil libraries
  # that do (libabsl_cordz_info): their calls are wrapped too, but the linker would not pull the
  # wrappers out of libadaptcomm_internal.a for them (it is searched before those libraries).
  # Naming one wrapper as undefined pulls the object that defines them all; where nothing of ours
  # is linked, the name stays unresolved and unused, which the linker accepts.
  list(GET ADAPTCOMM_TSAN_ABSL_WRAPPED 0 _first_wrapped)
  add_link_options(-Wl,--undefined=__wrap_${_first_wrapped})

  # Runs at the end of the top-level CMakeLists.txt, once the adaptcomm_base target exists.
  function(adaptcomm_tsan_attach_absl_wrap)
    # A different abseil build (another inline namespace) would fail at link time with cryptic
    # undefined __real_ symbols: say why here instead.
    get_target_property(_absl_sync absl::synchronization IMPORTED_LOCATION_RELEASE)
    if(NOT _absl_sync)
      get_target_property(_absl_sync absl::synchronization IMPORTED_LOCATION_NONE)
    endif()
    find_program(ADAPTCOMM_NM nm)
    if(_absl_sync AND ADAPTCOMM_NM)
      execute_process(COMMAND ${ADAPTCOMM_NM} -D --defined-only ${_absl_sync}
                      OUTPUT_VARIABLE _defined RESULT_VARIABLE _rc)
      if(_rc EQUAL 0)
        foreach(sym ${ADAPTCOMM_TSAN_ABSL_WRAPPED})
          if(NOT _defined MATCHES " ${sym}\n")
            message(FATAL_ERROR "ADAPTCOMM_SANITIZE=thread: ${_absl_sync} does not define ${sym}; "
                                "update cmake/AdaptcommSanitizers.cmake and lib/base/tsan_absl_wrap.cc")
          endif()
        endforeach()
      endif()
    endif()
    set(wrap ${PROJECT_SOURCE_DIR}/lib/base/tsan_absl_wrap.cc)
    target_sources(adaptcomm_base PRIVATE ${wrap})
    # The layers are compiled with hidden visibility; programs that link libadaptcomm.so (the demo
    # trainer, a trainer's own TSan build) call these wrappers too.
    set_source_files_properties(${wrap} TARGET_DIRECTORY adaptcomm_base
                                PROPERTIES COMPILE_OPTIONS "-fvisibility=default")
  endfunction()
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL adaptcomm_tsan_attach_absl_wrap)
elseif(NOT ADAPTCOMM_SANITIZE STREQUAL "")
  message(FATAL_ERROR "ADAPTCOMM_SANITIZE must be '', 'address' or 'thread', not '${ADAPTCOMM_SANITIZE}'")
endif()
