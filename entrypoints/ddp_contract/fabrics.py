"""The fabrics ddp-launch knows, in the order detection tries them on a node; a site profile's
"fabric" names one of them, or AUTO.

Each name is a module of ddp_launch/fabric/ (how a node shows the fabric, the rules that need the
node, whether it is high-speed: fabric/common.py's Fabric) and, where it has values of its own,
containers/sites/fabrics/<name>.json. A new fabric is those two and its name here, in its place in the
order. The names are in the contract because the job scripts read site profiles with the host's
python3 (3.6 on SLES 15), which never imports the launcher. Python 3.6, standard library.
"""

# Ethernet last: every node has it.
FABRICS = ("slingshot", "infiniband", "ethernet")
# A site profile's "fabric" that leaves the choice to detection on the node.
AUTO = "auto"
