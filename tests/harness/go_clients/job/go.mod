module kvproxy.test/goclients/job

go 1.22
