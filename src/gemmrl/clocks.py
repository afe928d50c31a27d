"""The SM clock ceiling a busy-wait is sized by (NVML, read-only): shared by the timing protocols and the battery's
stream-order probe, so neither imports the other for it."""

from __future__ import annotations

FALLBACK_MAX_SM_MHZ = 2100.0  # above every current datacenter GPU's boost clock
_MAX_SM_MHZ: dict[int, float] = {}


def max_sm_mhz(device: int) -> float:
    """The SM clock ceiling (NVML's max clock; read-only). A busy-wait of ``us * max_sm_mhz`` cycles lasts at
    least ``us`` at any clock. Calibrating against the current clock is fragile: the H100 idles at 435 MHz,
    so a calibration made then gives waits 4.5x too short at 1980 MHz (a likely cause of the launch-latency
    outliers left in the first cold sweep at the smallest shapes)."""
    if device not in _MAX_SM_MHZ:
        try:
            import pynvml  # optional dependency: NVML where installed

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(device)
            _MAX_SM_MHZ[device] = float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)) or FALLBACK_MAX_SM_MHZ
        except Exception:  # noqa: BLE001 - no NVML: the safe ceiling
            _MAX_SM_MHZ[device] = FALLBACK_MAX_SM_MHZ
    return _MAX_SM_MHZ[device]
