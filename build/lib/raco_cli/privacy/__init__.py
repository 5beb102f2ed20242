"""Mechanisms, DpEvent trees and accounting.  Knows nothing of Hydra or training loops."""
