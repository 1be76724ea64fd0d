"""FKC contract files shipped with fuel_torch (data only; loaded by fuel_torch.contracts)."""
