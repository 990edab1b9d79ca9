"""Targets: the accelerators a user trains on, compiled for from any machine.

* ``target_mesh``   - a mesh of compile-only TPUs or GPUs.
* ``abstract_arguments`` - a step's arguments placed on such a mesh (``on_target``).
* ``gpu_configs``   - the GPU target configs shipped and registered.
* ``device_memory`` - how much memory a device has.
"""

from remat_explorer.analysis.targets.abstract_arguments import on_target
from remat_explorer.analysis.targets.device_memory import device_memory_bytes
from remat_explorer.analysis.targets.gpu_configs import (gpu_target_config,
                                                         gpu_target_names,
                                                         register_gpu_target)
from remat_explorer.analysis.targets.target_mesh import target_mesh

__all__ = ['target_mesh', 'on_target', 'register_gpu_target', 'gpu_target_config', 'gpu_target_names',
           'device_memory_bytes']
