# Repair include paths that the PyPI ROS wheels (ros-*-msgs) bake into their exported CMake targets.
#
# Those wheels are built in a manylinux container, so targets such as
# std_msgs::std_msgs__rosidl_generator_py carry
#   /opt/python/cp311-cp311/include/python3.11
#   /opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include
# which do not exist on the machine that links against them; CMake then refuses to generate.
# Only entries that do not exist on disk and look like a Python or NumPy include directory are
# replaced, so in a real ROS 2 install (where every exported path exists) this is a no-op.

function(trajectory_ensemble_fix_wheel_include_dirs)
  get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  set(_need_python FALSE)
  set(_broken_targets "")
  foreach(_target IN LISTS _targets)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT _dirs)
      continue()
    endif()
    foreach(_dir IN LISTS _dirs)
      # Generator expressions cannot be checked for existence here; leave them alone.
      if(_dir MATCHES "^\\$<" OR EXISTS "${_dir}")
        continue()
      endif()
      if(_dir MATCHES "/include/python3\\.[0-9]+$" OR _dir MATCHES "/numpy/(_core|core)/include$")
        list(APPEND _broken_targets ${_target})
        set(_need_python TRUE)
        break()
      endif()
    endforeach()
  endforeach()
  if(NOT _need_python)
    return()
  endif()

  find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module NumPy)
  foreach(_target IN LISTS _broken_targets)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    set(_fixed "")
    foreach(_dir IN LISTS _dirs)
      if(NOT _dir MATCHES "^\\$<" AND NOT EXISTS "${_dir}")
        if(_dir MATCHES "/include/python3\\.[0-9]+$")
          set(_dir ${Python3_INCLUDE_DIRS})
        elseif(_dir MATCHES "/numpy/(_core|core)/include$")
          set(_dir ${Python3_NumPy_INCLUDE_DIRS})
        endif()
      endif()
      list(APPEND _fixed ${_dir})
    endforeach()
    list(REMOVE_DUPLICATES _fixed)
    set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_fixed}")
  endforeach()
  list(LENGTH _broken_targets _count)
  message(STATUS "trajectory_ensemble_msgs: pointed ${_count} wheel-exported target(s) at "
    "${Python3_INCLUDE_DIRS} and ${Python3_NumPy_INCLUDE_DIRS}")
endfunction()
