"""What is computed from recorded cases: run comparison and history (`compare`), training parity (`parity`),
roofline and waterfall attribution, the memory model and the device calibration."""
