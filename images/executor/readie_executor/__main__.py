import sys

from readie_executor.server import main

sys.exit(main())
