"""`python -m meshdl ...`: the same command line as `meshdl ...`."""

from meshdl.cli import main

main()
