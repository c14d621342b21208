"""Test machinery shared by every area: a SeaweedFS server, a TCP fault proxy, leak guards,
a child interpreter for code that may crash its process (Ray)."""
