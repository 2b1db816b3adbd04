"""Shipped profiles (*.json) and, in profiles/hardware, the hardware presets (data only)."""
