"""Generated codecs of control record values. Do not edit."""
