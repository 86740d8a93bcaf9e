"""Adaptation training of the SideNet (paper section 3.1, appendix C)."""
