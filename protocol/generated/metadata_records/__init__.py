"""Generated metadata record codecs. Do not edit."""
