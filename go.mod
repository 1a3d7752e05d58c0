module readie.dev/pipeline

go 1.26
