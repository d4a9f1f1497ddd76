# nabla.pc, for C programs on the C API (include/nabla.h):
#   cc prog.c $(pkg-config --cflags --libs nabla)
# Relocatable: its prefix is found from the .pc file's own place, so it holds
# wherever `cmake --install --prefix` puts it.
file(RELATIVE_PATH NABLA_PC_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" NABLA_PC_PREFIX "\${pcfiledir}/${NABLA_PC_PREFIX}")

if(BUILD_SHARED_LIBS)
  # libnabla.so records its own dependencies (DT_NEEDED).
  set(NABLA_PC_LIBS "-lnabla")
else()
  # A static libnabla.a needs its dependencies on the link line, the C++
  # runtime included for a C program. They are in Libs, not Libs.private, so
  # that the plain command above links without --static. -l:libnabla.a names
  # the archive: -lnabla would pick libnabla.so, installed beside it for FFI,
  # and the program would then need the library path at run time.
  set(NABLA_PC_DEPS "")
  if(CMAKE_THREAD_LIBS_INIT)
    list(APPEND NABLA_PC_DEPS ${CMAKE_THREAD_LIBS_INIT})
  endif()
  list(APPEND NABLA_PC_DEPS -lz)
  if(NABLA_USES_OPENBLAS)
    list(APPEND NABLA_PC_DEPS -lopenblas)
  endif()
  if(NABLA_HAS_CUDA)
    list(APPEND NABLA_PC_DEPS -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt)
  endif()
  # The C++ compiler's own libraries that the C compiler does not link
  # (libstdc++ and libm for g++).
  foreach(lib ${CMAKE_CXX_IMPLICIT_LINK_LIBRARIES})
    if(NOT lib IN_LIST CMAKE_C_IMPLICIT_LINK_LIBRARIES AND NOT "-l${lib}" IN_LIST NABLA_PC_DEPS)
      list(APPEND NABLA_PC_DEPS -l${lib})
    endif()
  endforeach()
  list(JOIN NABLA_PC_DEPS " " NABLA_PC_DEPS)
  set(NABLA_PC_LIBS "-l:libnabla.a ${NABLA_PC_DEPS}")
endif()

configure_file(${PROJECT_SOURCE_DIR}/cmake/nabla.pc.in ${PROJECT_BINARY_DIR}/nabla.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/nabla.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
