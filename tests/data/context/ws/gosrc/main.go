package main

import (
	"fmt"
	str "strings"
)

type Server struct {
	Name string
	Port int
}

type Handler interface {
	Serve(name string) error
}

// Start launches the server.
func (s *Server) Start(verbose bool) error {
	fmt.Println(str.ToUpper(s.Name))
	return nil
}

func NewServer(name string) *Server {
	return &Server{Name: name}
}
