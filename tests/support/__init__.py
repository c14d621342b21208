"""Test machinery shared by every area: a SeaweedFS server, a TCP fault proxy, leak guards."""
