"""Shared fixtures: the array backends the eager suite runs on, and hypothesis settings.

``backend`` runs a test twice: on NumPy (the normal ``cpu`` devices) and on
array-api-strict, whose fake devices stand behind ``cpu``, ``cpu:1`` and ``cpu:2``.
array-api-strict has only what the Array API standard promises and raises when arrays
of two devices meet, so a test that passes on it proves the code is device-generic and
never mixes devices behind minigraph's back.
"""

from __future__ import annotations

import importlib
import os

import pytest
from hypothesis import HealthCheck, settings

import minigraph as mg

# mg.device is the scope function; the module of the same name holds the registry.
device_module = importlib.import_module("minigraph.device")

settings.register_profile("default", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, max_examples=60, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])
# CI=true picks "ci"; `pytest --hypothesis-profile=thorough` searches much harder.
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture
def strict_devices():
    """Put array-api-strict's CPU_DEVICE, device1, device2 behind cpu, cpu:1, cpu:2."""
    xps = pytest.importorskip("array_api_strict")
    saved = dict(device_module._registry)
    natives = ["CPU_DEVICE", "device1", "device2"]
    for name, native in zip(["cpu", "cpu:1", "cpu:2"], natives):
        mg.register_device(name, xps, xps.Device(native))
    yield
    device_module._registry.clear()
    device_module._registry.update(saved)


@pytest.fixture(params=["numpy", "strict"])
def backend(request):
    """Run the test on NumPy devices and on array-api-strict's fake devices."""
    if request.param == "strict":
        request.getfixturevalue("strict_devices")
    return request.param


@pytest.fixture(autouse=True)
def _virtual_cpus_as_they_were():
    """A test may call mg.set_virtual_cpus; the next test finds the count it had before.
    (Two tests left 2 and 7 behind, and test_default_devices failed or passed by the order
    the files ran in: it failed on a GPU machine, where fewer files run before it.)"""
    before = device_module._virtual_cpus
    yield
    if device_module._virtual_cpus != before:
        mg.set_virtual_cpus(before)

