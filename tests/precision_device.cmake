# The device mixed-precision path runs on the fake CUDA/NCCL seam (tests/nccl.cmake builds it).
if(TARGET precision_device_test AND TARGET adaptcomm_fake_nccl)
  target_link_libraries(precision_device_test PRIVATE adaptcomm_fake_nccl)
endif()
