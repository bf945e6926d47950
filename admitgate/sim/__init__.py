"""The lab users run from the command line: the herd simulator, the socket herd driver, the demo app and
its server helpers.
"""
