"""Put torchvision's import through the test shim in every child process of the suite.

tests/conftest.py puts this folder first on ``PYTHONPATH``; the hook imports nothing until
something imports torchvision (tests/support/torchvision_shim.py says why it is needed).
"""

import importlib.util
import os
import sys

_support = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_path = os.path.join(_support, "torchvision_shim.py")
_spec = importlib.util.spec_from_file_location("_fastload_torchvision_shim", _path)
if _spec is not None and _spec.loader is not None:
    _shim = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _shim
    _spec.loader.exec_module(_shim)
    _shim.register()
