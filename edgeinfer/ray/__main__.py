import sys

from edgeinfer.ray import main

sys.exit(main())
