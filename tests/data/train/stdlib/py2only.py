print "this is Python 2"
